#pragma once
// inference_server: central inference for actor/learner RL (rl.inference
// "central", SEED RL, Espeholt et al. 2020). It holds the policy beside
// learner 0, which hands it its weights after every update; rl_actors in
// other processes send it each step's observations (the protocol:
// inference_server_actor in messages/rl_messages.hpp), and those of its own
// process ask its batcher directly (actors/inference_batcher.hpp). Requests
// are batched: a batch runs once it holds max_batch rows, every live actor
// has asked, or max_wait_us passed since its first request; one batch
// computes at a time (the server's on its device thread), and the next one
// fills meanwhile. Each actor's actions are sampled from its own stream,
// seeded as a local rl_actor's, so they depend on the weights and the
// actor's observations only, not on the batch or path they ran in. A
// requester that dies is no longer waited for.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "actors/device_tasks.hpp"
#include "actors/inference_batcher.hpp"
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
  int64_t yield_us = 200;      // of an actor of this process waiting in the batcher
  std::string forward_device;  // "sim:N", "cuda:N": the forward runs there (rl.central.device)
  // The policy and its batches (made by spawn_inference_server).
  std::shared_ptr<inference_batcher> batcher;
};

struct inference_server_state {
  struct waiting_request {
    inference_request request;
    caf::typed_response_promise<inference_reply> promise;
  };
  inference_server_config cfg;
  std::unique_ptr<device_tasks<inference_batcher>> tasks;
  std::vector<waiting_request> waiting;  // the next batch
  int64_t waiting_rows = 0;
  int64_t batch_number = 0;                       // of the next batch (its wait's flush names it)
  bool overdue = false;                           // the next batch waited max_wait_us
  bool running = false;                           // a batch is on the device
  int64_t version = -1;                           // the newest weights known
  std::map<caf::actor_addr, int64_t> requesters;  // live ones, monitored
  int64_t live = 1;
  trace::state_track track;
  static inline const char* name = "inference_server";
};

inference_server_actor::behavior_type inference_server(
    inference_server_actor::stateful_pointer<inference_server_state> self,
    inference_server_config cfg);

// Spawns an inference server (its mailbox hand-over visible to ThreadSanitizer)
// and registers its batcher for the rl_actors of this process
// (actors/inference_batcher.hpp).
inference_server_actor spawn_inference_server(caf::actor_system& sys, inference_server_config cfg);

}  // namespace troupe
