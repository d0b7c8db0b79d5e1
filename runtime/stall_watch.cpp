#include "runtime/stall_watch.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace troupe {

stall_watch::stall_watch(std::string who, std::string waits_on, std::chrono::milliseconds limit,
                         std::function<int64_t()> progress, std::function<bool()> active)
    : who_(std::move(who)),
      waits_on_(std::move(waits_on)),
      limit_(std::max(limit, std::chrono::milliseconds(1))),
      progress_(std::move(progress)),
      active_(std::move(active)),
      thread_([this] { run(); }) {}

stall_watch::~stall_watch() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void stall_watch::run() {
  using clock = std::chrono::steady_clock;
  const auto poll = std::min<std::chrono::milliseconds>(limit_ / 4 + std::chrono::milliseconds(1),
                                                        std::chrono::seconds(1));
  int64_t seen = progress_();
  auto since = clock::now();  // when `seen` was first seen (or the watch last spoke)
  auto quiet = since;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, poll, [this] { return stopping_; })) {
    const auto now = clock::now();
    const int64_t step = progress_();
    if (step != seen || !active_()) {
      seen = step;
      since = quiet = now;
      continue;
    }
    if (now - quiet < limit_) continue;
    quiet = now;
    ++warnings_;
    spdlog::warn("{}: no update for {:.1f} s (step {}); waiting on {}", who_,
                 std::chrono::duration<double>(now - since).count(), step, waits_on_);
  }
}

}  // namespace troupe
