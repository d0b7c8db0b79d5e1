#pragma once
// What SIGINT (Ctrl-C), SIGTERM (Kubernetes, scancel) and SIGUSR1 (SLURM's
// --signal) do to `troupe run` and `troupe node`; `troupe launch` forwards
// them to its tasks, which apply it (cli/launch.hpp). The process is always
// in one explicit phase, and the phase decides:
//
//   phase                                     first signal                 exit status
//   loading data, rendezvous, joining         stop at once, say the phase  128 + signal
//   training                                  stop at the next update,     75
//                                             with a checkpoint
//   final evaluation, writing results         stop at once, say the phase  128 + signal
//   leaving a preempted job (a task told by   stop at once                 75
//   the chief: the checkpoint is written)
//   a second SIGINT/SIGTERM, any phase        exit at once                 128 + signal
//   training past cluster.grace_seconds       exit at once                 75
//
// 128 + signal is 130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1: the
// shell's "ended by this signal", nothing to resume. 75 (preemption.hpp):
// resumable. Every stop of a job that had started training leaves
// summary.json with a "stop_reason".
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace troupe::stop_policy {

enum class phase : int { loading, rendezvous, joining, training, evaluating, writing, leaving };

// "loading data", "the rendezvous", "joining the cluster", "training", "the
// final evaluation", "writing results", "leaving a preempted job".
const char* describe(phase p);

// Whether a signal in `p` stops with a checkpoint to resume from.
constexpr bool resumable(phase p) {
  return p == phase::training;
}

// The status of a stop that leaves nothing to resume, as a shell reports a
// process ended by `signal`.
constexpr int status_after(int signal) {
  return 128 + signal;
}

// The process's phase (the coordinator and troupe node move it on). Tests
// hold the process at a phase: see hold_for_test.
void enter(phase p);
phase current();

// SIGINT, SIGTERM and SIGUSR1: the handler records the signal for the
// guard, which asks a training job to stop (preemption::request).
void install_signal_handlers();

// The first SIGINT, SIGTERM or SIGUSR1 the process got, 0 while none.
int received();

// Called by the coordinator so that a stop which cannot wait for it still
// leaves a summary: the job's summary so far (job, strategy, output_dir, ...)
// and, cheaply after every update, the step.
void publish_job(const nlohmann::json& summary);
void publish_checkpoint(const std::string& path);
void publish_step(int64_t step);
// The step publish_step last gave (-1 before the first).
int64_t published_step();

// Test interface (the signal tests run troupe as a process): once
// hold_for_test_at(POINT, SECONDS) was called (fault_injection::hold, from
// TROUPE_TEST_HOLD="POINT:SECONDS"; runtime/test_hooks.hpp), the process
// logs "holding at POINT" and sleeps SECONDS when it reaches POINT: a phase
// ("loading", "evaluating", "writing", ...) or "checkpoint" (every
// checkpoint write). Set before the job's threads start.
void hold_for_test_at(std::string point, double seconds);
void hold_for_test(std::string_view point);

// The CLI's side of the table: from construction to destruction, reacts to
// the signals the handlers counted (polling every 20 ms): logs the line,
// writes the summary of a started job, and exits where the table says so.
class guard {
 public:
  explicit guard(double grace_seconds);
  ~guard();
  guard(const guard&) = delete;
  guard& operator=(const guard&) = delete;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::stop_policy
