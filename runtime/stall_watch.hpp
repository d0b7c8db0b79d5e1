#pragma once
// A job that stops making progress says so, naming who it waits on (issue
// 40: a chief whose worker's routes had been taken over waited at one step
// for 70 s without a line). Peers that die or hang are detected by their
// connection and BASP's heartbeats; this covers the rest: a step whose
// answers never come while every connection looks alive.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace troupe {

class stall_watch {
 public:
  // While `active()`, polls `progress()` (the job's update count); once it
  // has not moved for `limit`, logs at warning "`who`: no update for N s
  // (step S); waiting on `waits_on`", and again after each further `limit`.
  stall_watch(std::string who, std::string waits_on, std::chrono::milliseconds limit,
              std::function<int64_t()> progress, std::function<bool()> active);
  ~stall_watch();
  stall_watch(const stall_watch&) = delete;
  stall_watch& operator=(const stall_watch&) = delete;

  uint64_t warnings() const { return warnings_; }

 private:
  void run();

  std::string who_, waits_on_;
  std::chrono::milliseconds limit_;
  std::function<int64_t()> progress_;
  std::function<bool()> active_;
  std::atomic<uint64_t> warnings_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe
