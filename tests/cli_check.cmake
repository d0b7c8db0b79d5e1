# Runs CMD (a ;-list), checks its exit code is EXPECT_RC and its combined
# output matches every regex in EXPECT_OUT (a ;-list).
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                WORKING_DIRECTORY ${WORKDIR} TIMEOUT 120)
set(all "${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}\n--- output:\n${all}")
endif()
foreach(re IN LISTS EXPECT_OUT)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "output does not match '${re}'\n--- output:\n${all}")
  endif()
endforeach()
