#pragma once
// inference_server: central inference for actor/learner RL (rl.inference
// "central", SEED RL, Espeholt et al. 2020). It holds the policy on a device
// thread, beside learner 0, which hands it its weights after every update;
// rl_actors send it each step's observations (the protocol:
// inference_server_actor in messages/rl_messages.hpp). Requests are batched:
// a batch runs once it holds max_batch rows, every live actor has asked, or
// max_wait_us passed since its first request; one batch is on the device at a
// time, and the next one fills meanwhile. Each actor's actions are sampled
// from its own stream, seeded as a local rl_actor's, so they depend on the
// weights and the actor's observations only, not on the batch they ran in.
// A requester that dies is no longer waited for.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "actors/device_tasks.hpp"
#include "config/job_config.hpp"
#include "devices/device.hpp"
#include "messages/rl_messages.hpp"
#include "models/policy_value.hpp"
#include "models/random.hpp"
#include "trace/trace.hpp"

namespace troupe {

struct inference_server_config {
  std::shared_ptr<cpu_device> device;
  model_config model;
  int64_t observation_size = 0;
  policy_head head;
  uint64_t seed = 0;   // the job's: every actor's sampling stream derives from it
  int64_t actors = 1;  // requesters a batch waits for (fewer once some died)
  int64_t max_batch = 4096;
  int64_t max_wait_us = 2000;
};

// The server's device state.
struct inference_compute {
  std::unique_ptr<policy_value_model> net;
  std::map<int64_t, splitmix64> streams;  // by actor index
  std::vector<float> observations, outputs, values, probs;
};

struct inference_server_state {
  struct waiting_request {
    inference_request request;
    caf::typed_response_promise<inference_reply> promise;
  };
  inference_server_config cfg;
  std::shared_ptr<inference_compute> compute;
  std::unique_ptr<device_tasks<inference_compute>> tasks;
  std::vector<waiting_request> waiting;  // the next batch
  int64_t waiting_rows = 0;
  int64_t batch_number = 0;                       // of the next batch (its wait's flush names it)
  bool overdue = false;                           // the next batch waited max_wait_us
  bool running = false;                           // a batch is on the device
  std::optional<policy_weights> weights;          // newer than the installed ones
  int64_t version = -1;                           // the newest weights known
  std::map<caf::actor_addr, int64_t> requesters;  // live ones, monitored
  int64_t live = 1;
  inference_stats ran;  // batches and rows run so far
  trace::state_track track;
  static inline const char* name = "inference_server";
};

inference_server_actor::behavior_type inference_server(
    inference_server_actor::stateful_pointer<inference_server_state> self,
    inference_server_config cfg);

// Spawns an inference server (its mailbox hand-over visible to ThreadSanitizer).
inference_server_actor spawn_inference_server(caf::actor_system& sys, inference_server_config cfg);

// One batch on the server's device: the outputs of `c`'s policy on every
// request's observations in one forward, and each request's actions sampled
// from its actor's stream (epsilon-greedy on the outputs as Q-values with a
// request's epsilon >= 0; none with outputs_only). (The server's device
// task; exposed for tests.)
std::vector<inference_reply> infer_batch(inference_compute& c, const policy_head& head,
                                         uint64_t seed, const std::vector<inference_request>& batch,
                                         int64_t version);

}  // namespace troupe
