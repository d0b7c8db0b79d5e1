#pragma once
// idle_wait: how a thread that waits in a collective for a peer process
// (the next bytes on a direct link, runtime/process_ring.cpp) looks again
// before it goes to sleep: in a tight
// loop for spin_for, then giving its core away between looks until
// yield_for, and only then asleep (poll(), a condition variable) until it
// is woken.
//
// Why: the peer's answer is usually microseconds away, and a sleeper is
// woken a scheduler's slice late whenever other work holds the cores. On 2
// vCPUs under load (bench/results/2026-11-29.md) sleeping at once cost the
// 2-process job 0.7-1 ms a step; yielding first made it 1.6-1.9x as fast
// (TCP + TLS 51k -> 86k samples/s, plaintext 77k -> 126k, Unix socket 83k
// -> 154k, medians of 7 alternated pairs). The tight loop alone lost whole
// time slices when the peer shared the core, and the job ran faster the
// longer it yielded before sleeping (shared ring, 0.5 ms: 87k samples/s,
// 3 ms: 152k, medians of 3): the processes' steps drift apart by about a
// step. The cost: up to yield_for of a core's time per wait, which is why
// it is a setting (strategy.reducer.yield_us): on a network whose latency
// is well above 3 ms a waiting thread only burns a core, and on a machine
// whose cores are all busy with other work 0 (sleep at once) may be best.
//
// Not for a wait whose answer needs this process's own threads: a device
// thread that waited so for the reducer actors' reply (ZeRO-1, two waits a
// step) took the cores the actors needed, and the job ran 4x slower on
// 2 vCPUs. Such a wait sleeps at once.
#include <chrono>
#include <thread>

namespace troupe {

class idle_wait {
 public:
  static constexpr auto spin_for = std::chrono::microseconds(2);
  static constexpr auto default_yield_for = std::chrono::microseconds(3000);

  explicit idle_wait(std::chrono::microseconds yield_for = default_yield_for)
      : yield_for_(yield_for) {}

  // After a look that found nothing: spins or yields once and returns true
  // (look again), or returns false once the caller should sleep.
  bool look_again() {
    const auto now = clock::now();
    if (since_ == clock::time_point::max()) since_ = now;
    const auto waited = now - since_;
    if (waited >= yield_for_) return false;
    if (waited < spin_for)
      relax();
    else
      std::this_thread::yield();
    return true;
  }
  // Something moved (or the caller slept and was woken): the next idle
  // stretch starts with a tight loop again.
  void reset() { since_ = clock::time_point::max(); }

 private:
  using clock = std::chrono::steady_clock;
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  std::chrono::microseconds yield_for_;
  clock::time_point since_ = clock::time_point::max();
};

}  // namespace troupe
