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

std::string replica_stopped(int64_t index) {
  return "replica " + std::to_string(index) + " stopped";
}

std::optional<int64_t> replica_named_stopped(const std::string& cause, int64_t self) {
  static const std::string head = "replica ", tail = " stopped";
  for (auto at = cause.find(head); at != std::string::npos; at = cause.find(head, at + 1)) {
    std::size_t end = at + head.size();
    int64_t index = 0;
    bool digits = false;
    while (end < cause.size() && cause[end] >= '0' && cause[end] <= '9' &&
           index < (int64_t{1} << 40)) {
      index = index * 10 + (cause[end++] - '0');
      digits = true;
    }
    if (digits && index != self && cause.compare(end, tail.size(), tail) == 0) return index;
  }
  return std::nullopt;
}

}  // namespace troupe
