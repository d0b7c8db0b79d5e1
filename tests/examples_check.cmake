# `troupe validate` on every config in examples/: each loads and is valid,
# so that no example rots unseen. The list is read at test time: a new
# example is checked without a line here.
file(GLOB examples "${SOURCE_DIR}/examples/*.json")
list(LENGTH examples n)
if(n LESS 10)
  message(FATAL_ERROR "only ${n} configs found in ${SOURCE_DIR}/examples")
endif()
foreach(example IN LISTS examples)
  execute_process(COMMAND ${TROUPE} validate ${example} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err WORKING_DIRECTORY ${SOURCE_DIR} TIMEOUT 60)
  if(NOT rc EQUAL 0 OR NOT "${out}${err}" MATCHES "valid")
    message(FATAL_ERROR "${example}: troupe validate exited ${rc}\n${out}${err}")
  endif()
  message(STATUS "valid: ${example}")
endforeach()
