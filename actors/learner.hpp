#pragma once
// learner: the policy being trained (models/policy_value.hpp), its optimizer
// and gradients on a device thread. Its loop, one update at a time:
//
//   dequeue B unrolls from the trajectory queue
//   -> device: forward, V-trace, loss gradients (models/impala.hpp)
//   -> with several learners: all-reduce (sum) of the gradients through the
//      job's reducers, so every learner applies the same update
//   -> device: global-norm clip, optimizer update (and, every K updates on
//      learner 0, a copy of the weights)
//   -> report to the coordinator; learner 0 announces its version to the
//      queue and publishes the weights through the coordinator.
//
// The next batch is requested while the current one computes.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "actors/device_tasks.hpp"
#include "config/job_config.hpp"
#include "devices/device.hpp"
#include "kernels/optimizer.hpp"
#include "messages/protocols.hpp"
#include "messages/rl_messages.hpp"
#include "models/dqn.hpp"
#include "models/impala.hpp"
#include "trace/trace.hpp"

namespace troupe {

struct learner_config {
  int64_t index = 0;
  int64_t learners = 1;
  // rl.population: the member this learner trains (its reports and weights
  // say so); -1 outside a population.
  int64_t member = -1;
  std::shared_ptr<cpu_device> device;
  model_config model;
  int64_t observation_size = 0;
  int64_t actions = 0;  // discrete actions, when head is not given
  std::optional<policy_head> head;
  optimizer_config optimizer;
  int64_t total_updates = 0;  // for learning-rate schedules (0: none known)
  uint64_t seed = 0;
  impala_settings impala;
  double grad_clip = 0;
  int64_t batch_unrolls = 1;   // this learner's share of every batch
  int64_t global_samples = 1;  // environment steps in a batch over all learners
  int64_t weights_every = 1;
  trajectory_queue_actor queue;
  reducer_actor reducer;  // null with one learner
  rl_reports_actor coordinator;
  // Central inference: learner 0 hands its weights to this server after
  // every update (weights_every does not apply), not to the coordinator.
  inference_server_actor inference;
  caf::duration request_timeout = caf::infinite;
  int64_t max_updates = 0;      // stop after this update (0: when told, halt_atom)
  int64_t fail_at_update = -1;  // test hook: the learner fails at this update
  // Ape-X: with replay shards, each batch is `replay_batch` transitions
  // sampled from the shards in turn, the loss is double DQN's
  // (models/dqn.hpp) with a target network copied from the online one every
  // `target_every` updates, and the new priorities go back to the shard the
  // batch came from. The policy outputs are the Q-values.
  std::vector<replay_shard_actor> replay;
  int64_t replay_batch = 256;
  int64_t target_every = 100;
};

// Built: until told to run. Waiting: for a batch of unrolls. Updating: an
// update is in flight (gradients, all-reduce, optimizer). Stopped: after its
// last update.
enum class learner_phase { built, waiting, updating, stopped };

// The learner's device state.
struct learner_compute {
  std::unique_ptr<policy_value_model> net;
  std::unique_ptr<kernels::optimizer> opt;
  std::vector<named_tensor> grads;
  impala_workspace ws;
  std::unique_ptr<policy_value_model> target;  // Ape-X's target network
  dqn_workspace dqn;
};

// rl.population's exploit, waiting for the update in flight to end (and,
// with several learners a member, for every one of them to hold it).
struct pending_exploit {
  model_state state;
  member_hyperparameters hyperparameters;
  caf::typed_response_promise<int64_t> done;
};

// A sampled replay batch and the shard it came from (Ape-X).
struct replay_batch {
  std::size_t shard = 0;
  replay_sample sample;
};

struct learner_state {
  learner_config cfg;
  std::shared_ptr<learner_compute> compute;
  std::unique_ptr<device_tasks<learner_compute>> tasks;
  std::vector<tensor> grad_buffers;  // shared with the reducer
  int64_t version = 0;               // updates applied
  learner_phase phase = learner_phase::built;
  std::optional<std::vector<unroll>> next_batch;  // arrived while updating
  std::optional<replay_batch> next_sample;        // Ape-X's, arrived while updating
  std::optional<pending_exploit> exploit;         // rl.population's, arrived while updating
  int64_t samples_requested = 0;                  // shards are sampled in turn
  int64_t empty_samples = 0;                      // in a row (shards below min_size)
  bool batch_requested = false;
  // Stopping: this learner's vote to stop (all-reduced with the gradients,
  // so that every learner stops after the same update), and who waits for
  // it to stop.
  bool halt_vote = false;
  // Timeline trace: computing gradients, reducing them, updating, or
  // waiting for a batch of unrolls.
  trace::state_track track;
  // [0]: votes to stop; [1]: learners that hold the exploit (rl.population
  // with several learners a member: it lands once all of them hold it).
  tensor votes{shape_t{2}};
  std::vector<caf::typed_response_promise<int64_t>> halted;
  static inline const char* name = "learner";
};

learner_actor::behavior_type learner(learner_actor::stateful_pointer<learner_state> self,
                                     learner_config cfg);

// Spawns a learner (its mailbox hand-over visible to ThreadSanitizer).
learner_actor spawn_learner(caf::actor_system& sys, learner_config cfg);

}  // namespace troupe
