# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -P run_consumer_test.cmake
# Installs the handgrad build into WORK_DIR/prefix, builds the consumer
# project in SOURCE_DIR against it, runs it.
file(REMOVE_RECURSE ${WORK_DIR})
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
if(NOT EXISTS ${WORK_DIR}/prefix/lib/cmake/handgrad/handgradConfig.cmake)
  message(FATAL_ERROR "no handgradConfig.cmake in the installed tree")
endif()
step("configure consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER})
step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step("run consumer" ${WORK_DIR}/build/consumer)
message(STATUS "${last_output}")
file(REMOVE_RECURSE ${WORK_DIR})
