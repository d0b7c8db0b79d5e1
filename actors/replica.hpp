#pragma once
// replica: one device, one copy of the model and optimizer. It handles the
// device, its batches, evaluation, state and restore; the training step
// itself is its strategy's (strategies/strategy.hpp: replica_step).
#include <deque>
#include <functional>
#include <memory>

#include "actors/device_tasks.hpp"
#include "actors/strategy_api.hpp"
#include "collectives/process_group.hpp"
#include "config/job_config.hpp"
#include "devices/device.hpp"
#include "kernels/backend.hpp"
#include "messages/protocols.hpp"
#include "models/model.hpp"
#include "trace/trace.hpp"

namespace troupe {

class replica_step;

struct replica_config {
  int64_t index = 0;
  std::shared_ptr<cpu_device> device;  // the thread that runs its tasks
  device_spec device_kind;             // what computes there (cpu:N, sim:N, cuda:N)
  model_config model;
  model_shape shape;
  optimizer_config optimizer;
  int64_t total_steps = 0;  // for learning-rate schedules
  uint64_t seed = 0;
  input_pipeline_actor input;
  // The strategy's step (owned by this replica once spawned).
  std::shared_ptr<replica_step> step;
  int64_t fail_at_step = -1;  // test hook: throw at this step
  // Synchronised batch norm (model::synced_statistics) over the process's
  // replicas of a lockstep strategy: the group and this replica's rank in it
  // (null: each replica normalises with its own batch). Aborted when this
  // replica goes, so that no other waits for it forever.
  std::shared_ptr<group_rendezvous> statistics_group;
  int statistics_rank = 0;
  // Every request the replica makes (input, reducer, shards) fails after
  // this long (troupe node: peers may be in other processes).
  caf::duration request_timeout = caf::infinite;
  // data.placement "device" or "auto" (else "host"): the training set that
  // the replica's steps may read on the device (models/resident_steps.hpp),
  // and whether they are captured as graphs (training.step_graphs).
  std::string placement = "host";
  tensor resident_images, resident_labels;
  bool step_graphs = true;
  kernels::tf32_use tf32;  // training.tf32
  int64_t batch_rows = 0;  // a full step's rows, warmed up (and captured) before training
};

class replica_host_impl;

struct replica_state {
  replica_config cfg;
  std::shared_ptr<compute_state> compute;
  std::unique_ptr<replica_host_impl> host;
  // The device tasks in flight; their continuations run when `computed`
  // arrives.
  std::unique_ptr<device_tasks<compute_state>> tasks;
  std::deque<batch> batches;         // prefetched from the input pipeline
  const void* prefetched = nullptr;  // the batch last copied ahead to a discrete device
  // Requested steps not started: an execution of several steps (only when
  // the strategy's step runs executions) or one step.
  struct waiting_execution {
    int64_t first = 0;
    int64_t count = 1;
    step_promise one;         // count == 1
    execution_promise steps;  // count > 1
  };
  std::deque<waiting_execution> waiting_steps;
  int64_t batches_requested = 0;
  bool busy = false;                 // the strategy's step holds the replica (see replica_host)
  std::vector<tensor> grad_buffers;  // the gradients' buffers, shared with the reducer
  metric_sums train_metrics;
  // Timeline trace: what the replica computes or waits for (see
  // show_activity in replica.cpp), the step it is in, the communication it
  // waits for (null: none).
  trace::state_track track;
  int64_t current_step = -1;
  const char* communicating = nullptr;
  replica_state();
  ~replica_state();
  static inline const char* name = "replica";
};

// The actor itself only routes messages: a train request becomes the
// strategy's step, compute runs as device tasks, and the device reports back
// with `computed`.
replica_actor::behavior_type replica(replica_actor::stateful_pointer<replica_state> self,
                                     replica_config cfg);

// Spawns `replica` with its mailbox hand-over visible to ThreadSanitizer
// (actors/visible_mailbox.hpp): a batch built by the input pipeline's thread
// is read on the replica's device thread.
replica_actor spawn_replica(caf::actor_system& sys, replica_config cfg);

}  // namespace troupe
