#pragma once
// A few helper threads that join a caller's loop of independent parts: the
// caller runs parts itself and returns when every part is done, whether or
// not a helper woke in time. Made for the TLS records of a link's chunk
// (16 records of 256 KB sealed or opened side by side, each record's nonce
// fixed by its sequence number), where one thread per direction made the
// crypto the slowest stage of the transfer.
//
// Several callers may run at once (every link's two pump threads share the
// process's pool). Each participant of a run gets a lane, so that a caller
// can keep one cipher context per lane: lane 0 is the caller's, lane h + 1
// helper h's, and a helper works on one run at a time.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe {

class fork_join_pool {
 public:
  // `helpers` threads (0: run() is a plain loop on the caller), each
  // calling `at_exit` (if any) as it ends.
  explicit fork_join_pool(unsigned helpers, std::function<void()> at_exit = {});
  ~fork_join_pool();
  fork_join_pool(const fork_join_pool&) = delete;
  fork_join_pool& operator=(const fork_join_pool&) = delete;

  // Participants at most: the helpers and the caller.
  unsigned lanes() const { return static_cast<unsigned>(threads_.size()) + 1; }

  // Calls part(i, lane) for every i < parts, each once, and returns when all
  // have returned. `part` must not throw (it records its own failure).
  void run(std::size_t parts, const std::function<void(std::size_t part, unsigned lane)>& part);
  // The same, and hands the finished prefix on as it grows: ready(k) on the
  // caller's thread once parts [0, k) have all returned, k growing by
  // `batch` or more (less when the caller has nothing else to do), the
  // last call with k == parts. What follows a prefix is still being worked
  // on while `ready` runs (a link sends sealed records while later ones are
  // sealed).
  void run(std::size_t parts, const std::function<void(std::size_t part, unsigned lane)>& part,
           const std::function<void(std::size_t finished)>& ready, std::size_t batch);

  // The helpers the process's links use: TROUPE_TLS_CRYPTO_THREADS if set
  // (0-15), else a quarter of the hardware threads less one, at most 3 (none
  // below 8 hardware threads, where the training's own threads need the
  // cores).
  static unsigned default_helpers();

 private:
  struct job;
  void helper_loop(unsigned lane, const std::function<void()>& at_exit);
  // Claims the next part of j and runs it on `lane`; false when none is left.
  static bool run_one(job& j, unsigned lane);
  static void work_on(job& j, unsigned lane);
  // The caller's share of a run with `ready`: parts, and prefixes handed on.
  static void hand_on(job& j, const std::function<void(std::size_t)>& ready, std::size_t batch);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<job>> jobs_;
  bool stopping_ = false;
  std::atomic<unsigned> published_{0};  // jobs pushed so far: spinning helpers watch it
  std::vector<std::thread> threads_;
};

}  // namespace troupe
