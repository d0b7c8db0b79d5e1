#pragma once
// Skips that ctest counts as skips. A case whose precondition this host
// lacks (a dataset, python3, NCCL, a second GPU) calls skip_case(why) and
// returns; run_cases() then exits 77 when every case the run selected
// skipped, which ctest shows as "Skipped" (SKIP_RETURN_CODE 77). Such cases
// run as ctest entries of their own (troupe_test_case in
// tests/CMakeLists.txt), so that the skip names them alone.
#include <string>

namespace troupe::test {

// Says why (a doctest MESSAGE and a line on stdout) and counts the case as
// skipped; the caller returns.
void skip_case(const std::string& why);

// doctest's run with the command line; 77 when every selected case skipped.
int run_cases(int argc, char** argv);

}  // namespace troupe::test
