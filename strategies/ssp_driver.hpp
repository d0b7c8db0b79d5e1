#pragma once
// The per-worker driver (parameter_server, elastic_average): every worker
// steps on its own, each answer is one update, and stale synchronous
// parallel bounds how far the fastest may run ahead of the slowest. A lost
// worker is dropped and the job goes on; a restarted one rejoins level with
// the slowest; a late one (test hook) is admitted when its time comes.
//
// Also what these worker strategies share in the plan: each worker reads a
// batch of data.batch_size per step (disjoint slices of one round of W
// batches), so an epoch is W pushes per round of the data.
#include <functional>

#include "strategies/strategy.hpp"
#include "strategies/variable_shards.hpp"

namespace troupe {

class ssp_driver final : public job_driver {
 public:
  struct settings {
    // Steps the fastest worker may be ahead of the slowest (-1: unbounded).
    int64_t max_staleness = -1;
    // Called with the number of admitted, live workers whenever it changes
    // (and at start); e.g. the shards of synchronous rounds need it.
    std::function<void(coordinator_host&, int64_t)> contributors_changed;
  };
  ssp_driver(const job_plan& plan, settings s);

  void start(coordinator_host& h) override;
  void pump(coordinator_host& h) override;
  bool replica_lost(coordinator_host& h, std::size_t i, const std::string& cause) override;
  void rejoin(coordinator_host& h, std::size_t i, caf::actor a) override;
  std::vector<replica_actor> live(const coordinator_host& h) const override;

 private:
  struct worker_status {
    int64_t clock = 0;     // steps this worker has finished
    bool busy = false;     // a step is in flight
    bool alive = true;     // lost workers are dropped, the job goes on
    int64_t admit_at = 0;  // takes steps once this many updates are done (late join)
    bool admitted = false;
  };
  int64_t slowest_clock() const;
  void admit(coordinator_host& h);
  void issue(coordinator_host& h, std::size_t i);
  void contributors(coordinator_host& h);

  settings settings_;
  std::vector<worker_status> workers_;
};

// What the worker strategies (their model on variable shards) share: a
// worker steps on every batch of its own, an epoch is W pushes per round of
// W batches, each pipeline resumes at its own position, and a lost worker
// leaves the job running.
class sharded_worker_strategy : public sharded_strategy {
 public:
  void validate(const job_config& c) const override;
  bool survives_lost_workers() const override { return true; }
  int64_t updates_per_epoch(const job_config& c, int64_t examples) const override;
  input_plan input(const job_config& c, int64_t start_step, int64_t steps_per_epoch) const override;
  bool lockstep() const override { return false; }
};

}  // namespace troupe
