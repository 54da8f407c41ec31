# `cmake --install build` puts the library where other CMake projects find it:
#   find_package(stsa CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE stsa::stsa)
# Component "library": the static libraries stsa::stsa links (every room built), the public headers,
# the CMake package and a pkg-config file for other build systems:
#   c++ -std=c++20 app.cpp $(pkg-config --cflags --libs stsa)     (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig)
# component "cli": the stsa command. The Python package installs itself
# (src/python), and pip's build leaves these rules out.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_stsa_libraries stsa_api stsa_core stsa_reference stsa_cpu stsa_io stsa_router stsa_dist stsa_cuda_host)
if(TARGET stsa_cuda)
  list(APPEND _stsa_libraries stsa_cuda)
endif()
set_target_properties(stsa_api PROPERTIES EXPORT_NAME stsa)
install(TARGETS ${_stsa_libraries} EXPORT stsaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/stsa ${PROJECT_BINARY_DIR}/generated/stsa
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT library)

set(_stsa_package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/stsa)
install(EXPORT stsaTargets NAMESPACE stsa:: DESTINATION ${_stsa_package_dir} COMPONENT library)
# What the static libraries link privately must be found again by whoever links them.
set(STSA_PACKAGE_NEEDS_CUDA ${STSA_CUDA})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/stsaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/stsaConfig.cmake INSTALL_DESTINATION ${_stsa_package_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/stsaConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/stsaConfig.cmake ${PROJECT_BINARY_DIR}/stsaConfigVersion.cmake
        DESTINATION ${_stsa_package_dir} COMPONENT library)

# stsa.pc: the static libraries in link order (each before what it uses), then what they use: the
# libraries the build found by path (MPI, NCCL), CUDA's static runtime and what it needs. Relocatable:
# the prefix is found from the file's own place.
set(_stsa_pc_libs "")
foreach(_library stsa_api stsa_dist stsa_cuda stsa_router stsa_io stsa_cpu stsa_reference stsa_cuda_host stsa_core)
  if(TARGET ${_library})
    string(APPEND _stsa_pc_libs " -l${_library}")
  endif()
endforeach()
get_property(_stsa_pc_files GLOBAL PROPERTY STSA_LINKED_LIBRARY_FILES)
foreach(_file IN LISTS _stsa_pc_files)
  string(APPEND _stsa_pc_libs " ${_file}")
endforeach()
set(_stsa_pc_cflags "-I\${includedir}")
if(TARGET stsa_cuda)
  string(APPEND _stsa_pc_libs " ${CUDA_cudart_static_LIBRARY} -ldl -lrt")
  string(APPEND _stsa_pc_cflags " -DSTSA_HAS_CUDA")
endif()
file(RELATIVE_PATH _stsa_pc_up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" _stsa_pc_up "${_stsa_pc_up}")
file(WRITE ${PROJECT_BINARY_DIR}/stsa.pc "\
prefix=\${pcfiledir}/${_stsa_pc_up}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: stsa
Description: Spatio-temporal sparse attention for video diffusion transformers (C++20)
Version: ${PROJECT_VERSION}
Cflags: ${_stsa_pc_cflags}
Libs: -L\${libdir}${_stsa_pc_libs} -pthread
")
install(FILES ${PROJECT_BINARY_DIR}/stsa.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT library)

if(TARGET stsa_cli)
  install(TARGETS stsa_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()
