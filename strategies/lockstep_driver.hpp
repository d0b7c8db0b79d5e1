#pragma once
// The lockstep driver (one_device, mirrored, central_storage): every replica
// takes step s together, and the update is done when all have answered.
// Steps are kept in flight per replica so that a replica never idles
// between steps; they go out in executions of training.steps_per_execution
// steps (never across a boundary), each one request per replica.
//
// "auto" sizes the executions from the measured time per step: an execution
// of about 4 ms (at most 64 steps), where the hand-overs it saves cost a few
// percent at most; one step at a time until measured, and whenever a step
// takes longer than that. The measure goes on across boundaries.
#include <chrono>

#include "strategies/strategy.hpp"

namespace troupe {

class lockstep_driver final : public job_driver {
 public:
  void start(coordinator_host& h) override;
  void pump(coordinator_host& h) override;
  std::vector<replica_actor> live(const coordinator_host& h) const override;
  // The executions' size at the end ("auto": as last chosen) and how many
  // this run issued.
  void summarize(nlohmann::json& summary) const override;

 private:
  using clock = std::chrono::steady_clock;
  void issue(coordinator_host& h, int64_t first, int64_t count);
  // "auto": an execution of `count` steps is done; the next size follows.
  void measured(int64_t count);

  int64_t per_execution_ = 1;  // steps in the next execution
  int64_t executions_ = 0;     // issued in this run
  bool auto_ = false;
  clock::time_point last_done_;  // the last execution done, while steps are in flight
  double step_seconds_ = 0;      // "auto": moving average of the time per step
};

}  // namespace troupe
