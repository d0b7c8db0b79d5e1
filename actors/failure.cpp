#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

namespace troupe {

caf::error exception_exit_reason(const std::string& who, const std::exception_ptr& x) {
  std::string what;
  try {
    std::rethrow_exception(x);
  } catch (const std::exception& e) {
    what = e.what();
    if (what.empty()) what = "an exception without a message";
  } catch (...) {
    what = "an exception not derived from std::exception";
  }
  auto text = who + ": " + what;
  spdlog::error("{}", text);
  return caf::make_error(caf::sec::runtime_error, std::move(text));
}

}  // namespace troupe
