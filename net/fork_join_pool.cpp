#include "net/fork_join_pool.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

namespace troupe {

struct fork_join_pool::job {
  const std::function<void(std::size_t, unsigned)>* part;
  std::size_t parts;
  std::atomic<std::size_t> next{0};  // the next part to claim
  std::atomic<std::size_t> done{0};  // parts finished
  // Per part, whether it returned: only where the caller hands prefixes on.
  std::unique_ptr<std::atomic<bool>[]> finished;
};

fork_join_pool::fork_join_pool(unsigned helpers, std::function<void()> at_exit) {
  threads_.reserve(helpers);
  for (unsigned h = 0; h < helpers; ++h)
    threads_.emplace_back([this, h, at_exit] { helper_loop(h + 1, at_exit); });
}

fork_join_pool::~fork_join_pool() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stopping_ = true;
  }
  ++published_;
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

unsigned fork_join_pool::default_helpers() {
  const unsigned hw = std::thread::hardware_concurrency();
  const unsigned by_cores = hw < 8 ? 0 : std::min(3u, hw / 4 - 1);
  if (const char* env = std::getenv("TROUPE_TLS_CRYPTO_THREADS"); env && *env) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 0 && v <= 15) return static_cast<unsigned>(v);
    spdlog::warn("TROUPE_TLS_CRYPTO_THREADS: expected an integer from 0 to 15, got '{}'; using {}",
                 env, by_cores);
  }
  return by_cores;
}

bool fork_join_pool::run_one(job& j, unsigned lane) {
  const std::size_t i = j.next.fetch_add(1, std::memory_order_relaxed);
  if (i >= j.parts) return false;
  (*j.part)(i, lane);
  if (j.finished) j.finished[i].store(true, std::memory_order_release);
  j.done.fetch_add(1, std::memory_order_release);
  return true;
}

void fork_join_pool::work_on(job& j, unsigned lane) {
  while (run_one(j, lane)) {
  }
}

void fork_join_pool::run(std::size_t parts,
                         const std::function<void(std::size_t, unsigned)>& part) {
  run(parts, part, {}, parts);
}

void fork_join_pool::run(std::size_t parts, const std::function<void(std::size_t, unsigned)>& part,
                         const std::function<void(std::size_t)>& ready, std::size_t batch) {
  batch = std::max<std::size_t>(batch, 1);
  if (threads_.empty() || parts <= 1) {
    for (std::size_t i = 0; i < parts; ++i) {
      part(i, 0);
      if (ready && ((i + 1) % batch == 0 || i + 1 == parts)) ready(i + 1);
    }
    return;
  }
  auto j = std::make_shared<job>();
  j->part = &part;
  j->parts = parts;
  if (ready) j->finished = std::make_unique<std::atomic<bool>[]>(parts);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    jobs_.push_back(j);
  }
  published_.fetch_add(1, std::memory_order_release);
  wake_.notify_all();
  if (!ready) {
    work_on(*j, 0);
    // The helpers still in a part finish it within a record's time: spin.
    while (j->done.load(std::memory_order_acquire) < parts) std::this_thread::yield();
  } else {
    hand_on(*j, ready, batch);
  }
  std::lock_guard<std::mutex> guard(mutex_);
  if (auto it = std::find(jobs_.begin(), jobs_.end(), j); it != jobs_.end()) jobs_.erase(it);
}

void fork_join_pool::hand_on(job& j, const std::function<void(std::size_t)>& ready,
                             std::size_t batch) {
  std::size_t handed = 0, prefix = 0;
  while (handed < j.parts) {
    while (prefix < j.parts && j.finished[prefix].load(std::memory_order_acquire)) ++prefix;
    const bool worth_it = prefix - handed >= batch || (prefix == j.parts && prefix > handed);
    if (!worth_it) {
      if (run_one(j, 0)) continue;
      if (prefix == handed) {  // only helpers' parts left, none finished yet
        std::this_thread::yield();
        continue;
      }
    }
    ready(prefix);
    handed = prefix;
  }
}

void fork_join_pool::helper_loop(unsigned lane, const std::function<void()>& at_exit) {
  // A link's chunks come in bursts: after a run, a helper watches for the
  // next one for a while before it sleeps (a wake-up costs more than a
  // record's crypto).
  constexpr auto linger = std::chrono::microseconds(200);
  for (;;) {
    std::shared_ptr<job> j;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto claimable = [&] {
        while (!jobs_.empty() &&
               jobs_.front()->next.load(std::memory_order_relaxed) >= jobs_.front()->parts)
          jobs_.pop_front();
        return !jobs_.empty();
      };
      wake_.wait(lock, [&] { return stopping_ || claimable(); });
      if (stopping_) break;
      j = jobs_.front();
    }
    work_on(*j, lane);
    j.reset();
    const unsigned seen = published_.load(std::memory_order_acquire);
    const auto until = std::chrono::steady_clock::now() + linger;
    while (published_.load(std::memory_order_acquire) == seen &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  }
  if (at_exit) at_exit();
}

}  // namespace troupe
