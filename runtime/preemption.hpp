#pragma once
// Graceful preemption: a stop signal during training (SIGTERM from SLURM or
// Kubernetes, SIGUSR1, Ctrl-C; the whole table is runtime/stop_policy.hpp)
// asks the job to leave with a checkpoint instead of dying mid-step. The
// request is process-wide, made by stop_policy::guard (after its line) and
// read by whoever runs the job:
//   - the coordinator (through a `preemption::watch` in run_coordinator)
//     stops at the next update, writes a checkpoint and a marker beside it,
//     and the summary says "preempted";
//   - the CLI exits with kResumeExitStatus, and starting the same command
//     again resumes from that checkpoint (the marker stands for --resume);
//   - a deadline (cluster.grace_seconds, stop_policy::guard) bounds it all:
//     past it the process exits with the same status, resuming from the
//     latest checkpoint.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace troupe::preemption {

// sysexits' EX_TEMPFAIL: "a temporary failure; retry". Kubernetes restarts
// a pod that exits with it (restartPolicy OnFailure), SLURM can requeue it.
constexpr int kResumeExitStatus = 75;

// The marker a preempted job leaves in its checkpoint directory: JSON with
// the signal, the step and the checkpoint. A fresh start of the same job
// that finds it resumes (as --resume would) and removes it when it ends.
constexpr const char* kMarkerFile = "preempted.json";

// Asks for a preemption as if `signal` had arrived during training
// (async-signal-safe; stop_policy::guard and tests call it). The first
// request wins.
void request(int signal) noexcept;
// The signal that asked, 0 while none has.
int requested() noexcept;
// Forgets the request (tests; a library running several jobs in a row).
void reset() noexcept;

// "SIGTERM", "SIGUSR1", "SIGINT", or "signal N".
std::string signal_name(int signal);

// While alive, calls on_request(signal) once, on its own thread, as soon as
// a preemption is requested (at most poll_ms after it). Signal handlers may
// do almost nothing, so the work happens here.
class watch {
 public:
  explicit watch(std::function<void(int)> on_request, int poll_ms = 20);
  ~watch();
  watch(const watch&) = delete;
  watch& operator=(const watch&) = delete;

 private:
  void run();

  std::function<void(int)> on_request_;
  int poll_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe::preemption
