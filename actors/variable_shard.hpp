#pragma once
// variable_shard: one parameter server shard. It owns some pieces of the
// model's variables (actors/partitioner.hpp) and an optimizer over them,
// applies pushed gradients and answers pulls (protocol: variable_shard_actor
// in messages/protocols.hpp). It never waits for anything: an aggregate-mode
// push is answered later, by a response promise, when its step is applied.
//
// Modes:
// - async (aggregate == 0; parameter_server): every push is applied on
//   arrival, one optimizer update each.
// - aggregate (aggregate == K; central_storage, bulk-synchronous): the K
//   pushes of one worker_step are summed and applied as one update; all K are
//   answered after it. Scaling (the mean) is the workers' job: they scale
//   their gradients by 1/global_batch, so the sum is the global mean.
// A center shard (elastic_average) takes exchanges instead of pushes, in
// either mode: the same bookkeeping, and the update is c += d.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "config/job_config.hpp"
#include "kernels/optimizer.hpp"
#include "messages/protocols.hpp"
#include "trace/trace.hpp"

namespace troupe {

struct variable_shard_config {
  int64_t index = 0;  // for error messages and logs
  // The shard's pieces with their initial values; the shard keeps clones.
  std::vector<named_tensor> pieces;
  optimizer_config optimizer;
  int64_t total_steps = 0;  // for learning-rate schedules
  int64_t aggregate = 0;    // contributors per step; 0 = async
  // Holds elastic averaging's center: takes exchanges (c += d, no
  // optimizer) and refuses gradient pushes; a gradient shard refuses
  // exchanges. In aggregate mode an exchange for a round already applied is
  // applied on its own instead of refused: exchanges add up (a round applied
  // early when a contributor was dropped, then the late one).
  bool center = false;
  // Run on its own thread: a shard of large variables computes for a while
  // per update, which would hold up a scheduler thread.
  bool detached = false;
};

// One step being gathered in aggregate mode.
struct shard_round {
  std::vector<tensor> sum;  // in piece order; the shard's own buffers
  std::vector<int64_t> workers;
  std::vector<int64_t> based_on;  // per push: the version its gradient came from
  std::vector<caf::typed_response_promise<int64_t>> promises;
};

struct variable_shard_state {
  variable_shard_config cfg;
  trace::track_id track = trace::no_track;  // timeline trace: pulls, pushes, updates
  std::vector<named_tensor> vars;
  std::map<std::string, std::size_t> index_of;  // piece name -> position in vars
  // Per piece: a puller or a snapshot may still hold the current buffer, so
  // the next update must write into a fresh one (see apply in the .cpp).
  std::vector<bool> shared;
  std::unique_ptr<kernels::optimizer> opt;
  int64_t version = 0;
  int64_t aggregate = 0;
  std::map<int64_t, shard_round> rounds;  // aggregate mode, by worker_step
  int64_t last_applied_step = -1;         // aggregate mode
  shard_stats stats;
  double staleness_sum = 0;
  int64_t staleness_count = 0;  // pushes applied (aggregate: pending ones are not yet)
  static inline const char* name = "variable_shard";
};

variable_shard_actor::behavior_type variable_shard(
    variable_shard_actor::stateful_pointer<variable_shard_state> self, variable_shard_config cfg);

// Checks the config (throws std::invalid_argument naming the problem: an
// unknown optimizer or schedule kind, non-float32 or duplicate pieces, a
// negative aggregate) and spawns the shard, detached if cfg.detached.
variable_shard_actor spawn_variable_shard(caf::actor_system& sys, variable_shard_config cfg);

}  // namespace troupe
