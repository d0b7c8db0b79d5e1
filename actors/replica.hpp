#pragma once
#include <deque>
#include <functional>
#include <map>
#include <memory>

#include "actors/partitioner.hpp"
#include "actors/reducer.hpp"
#include "config/job_config.hpp"
#include "devices/device.hpp"
#include "messages/protocols.hpp"
#include "models/model.hpp"

namespace troupe {

struct replica_config {
  int64_t index = 0;
  std::shared_ptr<cpu_device> device;
  model_config model;
  model_shape shape;
  optimizer_config optimizer;
  int64_t total_steps = 0;  // for learning-rate schedules
  uint64_t seed = 0;
  input_pipeline_actor input;
  reducer_actor reducer;  // mirrored: all-reduces gradients; null for one_device
  // mirrored with strategy.shard_optimizer: reduce-scatter the gradients,
  // update this replica's segments, all-gather the variables.
  bool shard_optimizer = false;
  int64_t replicas = 1;
  reducer_config reducer_cfg;  // where the segments lie (reduce_scatter_segments)
  // central_storage, parameter_server: the variables live on these shards,
  // placed by `place`. A step pulls them, computes the gradients on them and
  // pushes each shard its pieces' gradients; the shards apply the update.
  std::vector<variable_shard_actor> shards;
  placement place;
  // parameter_server: every push is an update of its own, so gradients are
  // the mean over this worker's batch (else over the global batch).
  bool local_mean = false;
  // elastic_average: `shards` hold the center. The replica trains its own
  // copy with its own optimizer; every `period` steps it pulls the center c
  // and exchanges d = alpha (x - c): x -= d here, c += d by a push of d.
  // With rho > 0 every local gradient gets rho (x - c) for the last c seen.
  bool elastic = false;
  int64_t period = 1;
  double alpha = 0;
  double rho = 0;
  int64_t fail_at_step = -1;  // test hook: throw at this step
  // Every request the replica makes (input, reducer, shards) fails after
  // this long (troupe node: peers may be in other processes).
  caf::duration request_timeout = caf::infinite;
};

struct compute_state;  // model + optimizer: touched only on the device thread

struct replica_state {
  replica_config cfg;
  std::shared_ptr<compute_state> compute;
  uint64_t next_ticket = 0;
  // Continuations of device tasks, run on the actor when `computed` arrives.
  std::map<uint64_t, std::function<void()>> pending;
  std::deque<batch> batches;  // prefetched from the input pipeline
  std::deque<std::pair<int64_t, caf::typed_response_promise<step_stats>>> waiting_steps;
  int64_t batches_requested = 0;
  bool busy = false;            // a step is between gradients and update (with a reducer)
  bool elastic_joined = false;  // elastic_average: started from the center
  // elastic_average: pushes of the last exchange not answered yet; the next
  // exchange waits for them (synchronous: until the round is applied).
  int64_t exchange_pending = 0;
  std::function<void()> after_exchange;
  std::vector<tensor> grad_buffers;  // the gradients' buffers, shared with the reducer
  metric_sums train_metrics;
  static inline const char* name = "replica";
};

// A replica owns one model copy and its optimizer, and runs all their compute
// on its device thread. The actor itself only routes messages: a train request
// becomes a device task, and the device reports back with `computed`.
replica_actor::behavior_type replica(replica_actor::stateful_pointer<replica_state> self,
                                     replica_config cfg);

}  // namespace troupe
