#include "runtime/stop_policy.hpp"

#include <spdlog/spdlog.h>

#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "monitoring/output_file.hpp"
#include "runtime/preemption.hpp"

namespace troupe::stop_policy {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

constexpr const char* kPhaseNames[] = {
    "loading data",         "the rendezvous",  "joining the cluster",    "training",
    "the final evaluation", "writing results", "leaving a preempted job"};
// The phases' names for fault_injection::hold (TROUPE_TEST_HOLD).
constexpr const char* kPhasePoints[] = {"loading",    "rendezvous", "joining", "training",
                                        "evaluating", "writing",    "leaving"};

std::atomic<int> current_phase{static_cast<int>(phase::loading)};
// Set by the handlers: the first signal of any kind, and the latest
// SIGINT/SIGTERM that came after it (0: none).
std::atomic<int> first_signal{0};
std::atomic<int> again_signal{0};

// What a stop that cannot wait for the job writes as its summary.
std::mutex job_mutex;
nlohmann::json job_summary;  // empty until the job starts
std::atomic<int64_t> job_step{-1};

// Only records the signal: the guard decides, and asks the job to stop (so
// its line comes before anything the job logs about it).
extern "C" void on_stop_signal(int sig) {
  int saved = errno;
  int none = 0;
  if (!first_signal.compare_exchange_strong(none, sig) && (sig == SIGINT || sig == SIGTERM))
    again_signal.store(sig);
  errno = saved;
}

// The published summary with `reason`, written (atomically: a reader never
// sees half of it) where the job writes its own.
void write_stop_summary(const std::string& reason) {
  nlohmann::json s;
  {
    std::lock_guard<std::mutex> lock(job_mutex);
    s = job_summary;
  }
  if (s.empty() || !s.contains("output_dir")) return;  // no job had started
  if (const int64_t step = job_step.load(); step > s.value("steps", int64_t{0})) s["steps"] = step;
  s["stop_reason"] = reason;
  const fs::path dir = s["output_dir"].get<std::string>();
  try {
    monitoring::replace_file_atomically((dir / "summary.json").string(),
                                        (dir / ".summary.json.tmp").string(), s.dump(2) + '\n');
  } catch (const monitoring::output_file_error& e) {
    spdlog::error("cannot write {}", e.what());
  }
}

[[noreturn]] void leave(const std::string& reason, int status) {
  spdlog::warn("{}; exiting with status {}", reason, status);
  write_stop_summary(reason);
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(status);
}

}  // namespace

const char* describe(phase p) {
  return kPhaseNames[static_cast<int>(p)];
}

void enter(phase p) {
  current_phase.store(static_cast<int>(p));
  hold_for_test(kPhasePoints[static_cast<int>(p)]);
}

phase current() {
  return static_cast<phase>(current_phase.load());
}

void install_signal_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) ::sigaction(s, &sa, nullptr);
}

int received() {
  return first_signal.load();
}

void publish_job(const nlohmann::json& summary) {
  std::lock_guard<std::mutex> lock(job_mutex);
  job_summary = summary;
}

void publish_checkpoint(const std::string& path) {
  std::lock_guard<std::mutex> lock(job_mutex);
  job_summary["checkpoint"] = path;
}

void publish_step(int64_t step) {
  job_step.store(step, std::memory_order_relaxed);
}

int64_t published_step() {
  return job_step.load(std::memory_order_relaxed);
}

namespace {

// Set once, before the job's threads start (install_process_faults).
struct test_hold {
  std::string point;
  double seconds = 0;
};
test_hold& installed_hold() {
  static test_hold hold;
  return hold;
}

}  // namespace

void hold_for_test_at(std::string point, double seconds) {
  installed_hold() = {std::move(point), seconds};
}

void hold_for_test(std::string_view point) {
  const auto& hold = installed_hold();
  if (hold.point.empty() || hold.point != point) return;
  spdlog::warn("holding at {} for {:g} s (TROUPE_TEST_HOLD)", point, hold.seconds);
  spdlog::default_logger()->flush();
  std::this_thread::sleep_for(std::chrono::duration<double>(hold.seconds));
}

struct guard::impl {
  double grace;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::optional<clock_type::time_point> deadline;  // set once training was asked to stop
  std::thread thread;

  // One look at the signals: exits, or returns to look again.
  void check() {
    if (int again = again_signal.load())
      leave(preemption::signal_name(again) + " again: stopped at once, without waiting for the job",
            status_after(again));
    const int first = first_signal.load();
    if (!first) return;
    const auto name = preemption::signal_name(first);
    if (!deadline) {
      const phase p = current();
      // The chief already stopped the job with a checkpoint: the signal that
      // arrives late (Kubernetes signals every pod) is the same preemption.
      if (p == phase::leaving)
        leave(name + " while " + describe(p) + ": its checkpoint is written",
              preemption::kResumeExitStatus);
      if (!resumable(p))
        leave(name + " during " + describe(p) + ": stopped at once, nothing to resume",
              status_after(first));
      spdlog::warn(
          "{} during training: stopping at the next update with a checkpoint (exit status {}); "
          "leaving in at most {:g} s (cluster.grace_seconds); a second Ctrl-C or SIGTERM exits "
          "at once",
          name, preemption::kResumeExitStatus, grace);
      preemption::request(first);  // the coordinator's (or a task's) watch takes it from here
      deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                         std::chrono::duration<double>(grace));
    }
    if (clock_type::now() >= *deadline)
      leave(name + ": the job did not stop within cluster.grace_seconds (" +
                fmt::format("{:g}", grace) + " s); resume from the latest checkpoint",
            preemption::kResumeExitStatus);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      check();
      cv.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
};

guard::guard(double grace_seconds) : impl_(std::make_unique<impl>()) {
  impl_->grace = grace_seconds;
  impl_->thread = std::thread([i = impl_.get()] { i->run(); });
}

guard::~guard() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

}  // namespace troupe::stop_policy
