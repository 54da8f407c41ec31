# `cmake --install build` puts the library where other CMake projects find it:
#   find_package(stsa CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE stsa::stsa)
# Component "library": the static libraries stsa::stsa links (every room built), the public headers
# and the package files; component "cli": the stsa command. The Python package installs itself
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

if(TARGET stsa_cli)
  install(TARGETS stsa_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()
