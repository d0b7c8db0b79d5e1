#pragma once
// The lockstep driver (one_device, mirrored, central_storage): every replica
// takes step s together, and the update is done when all have answered.
// Steps are kept in flight per replica so that a replica never idles
// between steps; they go out in executions of training.steps_per_execution
// steps (never across a boundary), each one request per replica.
#include "strategies/strategy.hpp"

namespace troupe {

class lockstep_driver final : public job_driver {
 public:
  void pump(coordinator_host& h) override;
  std::vector<replica_actor> live(const coordinator_host& h) const override;

 private:
  void issue(coordinator_host& h, int64_t first, int64_t count);
};

}  // namespace troupe
