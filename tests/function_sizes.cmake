# No function outside tests/ and bench/ is over 120 lines long or of
# cyclomatic complexity over 40, as lizard measures them (docs/development.md,
# "Function size"). Fails listing every function over either limit.
# Run: cmake -DSOURCE_DIR=<repo> -DLIZARD=<path to lizard> -P tests/function_sizes.cmake
# LIZARD is the venv's (scripts/install-deps.sh); when it is not there, lizard
# on the PATH.
set(max_length 120)
set(max_ccn 40)
if(NOT LIZARD OR NOT EXISTS "${LIZARD}")
  find_program(lizard_on_path lizard)
  if(NOT lizard_on_path)
    message(FATAL_ERROR "lizard is not installed (not at '${LIZARD}', nor on the PATH): "
      "scripts/install-deps.sh installs it, pinned, into the venv it makes "
      "($TROUPE_VENV, by default ~/.cache/troupe-venv); then run ctest again")
  endif()
  set(LIZARD "${lizard_on_path}")
endif()
file(GLOB_RECURSE files RELATIVE "${SOURCE_DIR}"
  "${SOURCE_DIR}/*.cpp" "${SOURCE_DIR}/*.hpp" "${SOURCE_DIR}/*.cu")
# Not measured: the tests, the benchmarks, build trees and hidden folders.
list(FILTER files EXCLUDE REGEX "^(tests|bench|build[^/]*|\\.[^/]*)/")
list(SORT files)
list(LENGTH files count)
execute_process(COMMAND "${LIZARD}" -l cpp -C ${max_ccn} -L ${max_length} -w ${files}
  WORKING_DIRECTORY "${SOURCE_DIR}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR out MATCHES "warning:")
  message(FATAL_ERROR "functions over ${max_length} lines or of cyclomatic complexity over "
    "${max_ccn} (split them: docs/development.md, \"Function size\"):\n${out}${err}")
endif()
message(STATUS "function sizes: every function of ${count} files within ${max_length} lines "
  "and cyclomatic complexity ${max_ccn}")
