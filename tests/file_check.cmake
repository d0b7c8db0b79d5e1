# Checks that FILE exists and its text matches every regex in EXPECT (a
# ;-list): what a CLI test's command wrote, beside what it printed.
if(NOT EXISTS "${FILE}")
  message(FATAL_ERROR "${FILE}: not written")
endif()
file(READ "${FILE}" text)
foreach(re IN LISTS EXPECT)
  if(NOT text MATCHES "${re}")
    message(FATAL_ERROR "${FILE} does not match '${re}'")
  endif()
endforeach()
