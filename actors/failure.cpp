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

std::optional<std::string> failure_order::replica_down(std::size_t i, const std::string& cause,
                                                       std::optional<std::string> failure) {
  if (i >= down_.size()) return failure;  // not a replica it was made for
  down_[i] = 1;
  if (!failure) {
    if (held_for_ == static_cast<int64_t>(i)) return held_;
    return std::nullopt;
  }
  auto k = replica_named_stopped(cause, static_cast<int64_t>(i));
  if (k && static_cast<std::size_t>(*k) < down_.size() && !down_[static_cast<std::size_t>(*k)]) {
    // The first held failure stands, unless it was this replica's turn:
    // then its own, held for the one it names in turn.
    if (held_for_ < 0 || held_for_ == static_cast<int64_t>(i)) {
      held_ = std::move(*failure);
      held_for_ = *k;
    }
    return std::nullopt;
  }
  return failure;
}

}  // namespace troupe
