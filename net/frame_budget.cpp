#include "net/frame_budget.hpp"

#include <fmt/format.h>

#include <thread>

namespace troupe {

namespace {

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

}  // namespace

frame_budget::share::share(frame_budget& budget, std::string peer,
                           std::function<void(const std::string&)> cut)
    : budget_(budget), peer_(std::move(peer)), cut_(std::move(cut)) {
  std::lock_guard<std::mutex> lock(budget_.mutex_);
  budget_.shares_.push_back(this);
}

frame_budget::share::~share() {
  std::lock_guard<std::mutex> lock(budget_.mutex_);
  budget_.used_ -= held_;
  budget_.shares_.remove(this);
}

frame_budget& frame_budget::process() {
  // Never destroyed: links may end during static destruction.
  static auto* budget = new frame_budget;
  return *budget;
}

std::string frame_budget::reserve(share& s, uint64_t more, uint64_t limit,
                                  const std::function<bool()>& keep_waiting) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      switch (try_reserve(s, more, limit)) {
        case outcome::granted:
          return "";
        case outcome::cut:
          return s.cut_reason_;
        case outcome::wait:
          break;
      }
    }
    if (!keep_waiting()) return "the link stopped while it waited for room for its frame";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

frame_budget::outcome frame_budget::try_reserve(share& s, uint64_t more, uint64_t limit) {
  if (!s.cut_reason_.empty()) return outcome::cut;
  // A frame alone is never refused (it is within the cap, which the guard
  // checks): the budget is for frames side by side.
  if (used_ + more <= limit || used_ == s.held_) {
    if (s.held_ == 0) s.since_ = clock_type::now();
    used_ += more;
    s.held_ += more;
    return outcome::granted;
  }
  const auto now = clock_type::now();
  if (share* victim = slowest_old_frame(now)) {
    cut(*victim, limit, now);
    if (victim == &s) return outcome::cut;
  }
  return outcome::wait;
}

frame_budget::share* frame_budget::slowest_old_frame(clock_type::time_point now) const {
  share* slowest = nullptr;
  double slowest_rate = 0;
  for (share* s : shares_) {
    if (s->held_ == 0 || !s->cut_reason_.empty() || now - s->since_ < kMinAge) continue;
    const double rate =
        static_cast<double>(s->held_) / std::chrono::duration<double>(now - s->since_).count();
    if (!slowest || rate < slowest_rate) {
      slowest = s;
      slowest_rate = rate;
    }
  }
  return slowest;
}

void frame_budget::cut(share& victim, uint64_t limit, clock_type::time_point now) {
  ++cuts_;
  victim.cut_reason_ = fmt::format(
      "its unfinished frame held {:.1f} MiB for {:.1f} s, the slowest while this process's "
      "{:.0f} MiB for unfinished frames ran out (cluster.max_message_mb sets both)",
      mib(victim.held_), std::chrono::duration<double>(now - victim.since_).count(), mib(limit));
  if (victim.cut_) victim.cut_(victim.cut_reason_);
}

void frame_budget::settle(share& s, uint64_t held) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ = used_ - s.held_ + held;
  if (held > 0 && s.held_ == 0) s.since_ = clock_type::now();
  s.held_ = held;
}

uint64_t frame_budget::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

uint64_t frame_budget::cuts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cuts_;
}

}  // namespace troupe
