# cmake -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=... -P check_subproject.cmake
# Configures tests/install/subproject, which takes stsa's source tree in with add_subdirectory.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/subproject -B ${WORK_DIR} -G ${GENERATOR}
                        -DSTSA_SOURCE_DIR=${SOURCE_DIR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DSTSA_CUDA=OFF
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "configuring a project with stsa as its subdirectory failed (${status})")
endif()
