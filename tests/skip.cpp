#include "tests/skip.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <set>

namespace troupe::test {
namespace {

std::string current_case;
std::set<std::string> skipped_cases;
unsigned selected_cases = 0;

// Knows which case runs (for skip_case) and how many the filters selected.
struct skip_counter : doctest::IReporter {
  explicit skip_counter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    selected_cases = s.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData& d) override { current_case = d.m_name; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("troupe_skip_counter", 1, skip_counter);

}  // namespace

void skip_case(const std::string& why) {
  MESSAGE("skipped: " << why);
  std::printf("SKIPPED: %s: %s\n", current_case.c_str(), why.c_str());
  std::fflush(stdout);
  skipped_cases.insert(current_case);
}

int run_cases(int argc, char** argv) {
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  const int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  if (selected_cases == 0) {  // a filter that names no case must not pass as a run
    std::printf("no test case matches the filters\n");
    return 1;
  }
  if (!skipped_cases.empty())
    std::printf("%zu of %u test cases skipped\n", skipped_cases.size(), selected_cases);
  if (rc == 0 && !skipped_cases.empty() && skipped_cases.size() == selected_cases) return 77;
  return rc;
}

}  // namespace troupe::test
