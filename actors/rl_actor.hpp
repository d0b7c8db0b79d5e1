#pragma once
// rl_actor: M environments (envs/env.hpp) and a copy of the policy on a
// device thread. It acts in unrolls of T steps, one device task each
// (batched inference over its M environments, a sampled action per
// environment, one batch step of the environments), then offers the unroll
// to the trajectory queue and waits for the answer before acting again: the
// queue's credit. Newer weights are installed between unrolls, so each unroll
// is acted by one policy version.
//
// With an inference server (rl.inference "central", messages/rl_messages.hpp)
// the actor holds no policy of its own: per step it sends the observations
// of its M environments to the server and steps them with the actions it
// gets back. A server in the actor's own process is asked through its
// batcher instead, the whole unroll in one device task (no message a
// step). The unroll's pieces (begin_unroll, step_unroll) are the same for
// every source of actions; only where the actions come from differs.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/device_tasks.hpp"
#include "actors/inference_batcher.hpp"
#include "config/job_config.hpp"
#include "devices/device.hpp"
#include "envs/env.hpp"
#include "envs/python_env.hpp"
#include "messages/rl_messages.hpp"
#include "models/policy_value.hpp"
#include "models/random.hpp"
#include "trace/trace.hpp"

namespace troupe {

struct rl_actor_config {
  int64_t index = 0;
  std::shared_ptr<cpu_device> device;
  envs::env_choice env{"CartPole-v1"};
  int64_t envs = 1;           // M
  int64_t unroll_length = 1;  // T
  model_config model;
  std::optional<policy_head> head;  // none: the one the environment's actions take
  uint64_t seed = 0;
  trajectory_queue_actor queue;
  rl_reports_actor coordinator;
  // The enqueue's answer may take long (back-pressure); this bounds a lost
  // queue in another process.
  caf::duration request_timeout = caf::infinite;
  int64_t fail_after_unrolls = -1;  // test hook: the actor fails after this many unrolls
  // Central inference: the server that chooses the actions (null: the
  // actor's own copy of the policy does, with weights it is sent).
  inference_server_actor inference;
  // A server in this process is asked through its batcher, from the
  // actor's device thread (actors/inference_batcher.hpp); false: by
  // message, as one in another process (tests compare the two).
  bool inference_in_process = true;
  // Ape-X (actors/replay_shard.hpp): with replay shards, the policy's
  // outputs are read as Q-values, actions are epsilon-greedy under
  // `epsilon`, and each unroll goes to one shard in turn as n-step
  // transitions with initial priorities (|TD| under this actor's weights)
  // instead of to the queue. The shard's answer is the credit.
  std::vector<replay_shard_actor> replay;
  double epsilon = 0;
  int64_t n_step = 3;
  double discount = 0.99;
};

// Built: until told to run. Ready: to act the next unroll once some weights
// are known. Unrolling: an unroll is being acted or offered to the queue.
enum class rl_actor_phase { built, ready, unrolling };

// The actor's device state.
struct rl_actor_compute {
  std::unique_ptr<envs::vector_env> env;
  std::unique_ptr<policy_value_model> net;
  policy_head head;
  splitmix64 rng{0};
  std::vector<float> obs;  // the current observations [M, obs]
  std::vector<float> values, probs;
  std::vector<uint8_t> terminated, truncated;
  std::vector<double> episode_return;
  std::vector<int64_t> episode_length;
  double epsilon = -1;             // >= 0: epsilon-greedy on the outputs as Q-values (Ape-X)
  int64_t inference_requests = 0;  // to a batcher in this process, since the actor started
};

struct rl_actor_state {
  rl_actor_config cfg;
  std::shared_ptr<rl_actor_compute> compute;
  std::unique_ptr<device_tasks<rl_actor_compute>> tasks;
  std::optional<policy_weights> pending;  // newer weights, installed before the next unroll
  int64_t received_version = -1;          // newest weights received
  int64_t acting_version = -1;            // installed
  rl_actor_phase phase = rl_actor_phase::built;
  int64_t unrolls = 0;
  int64_t inference_requests = 0;  // central inference by message: sent since the actor started
  // Central inference in this process: the server's batcher (null: messages).
  std::shared_ptr<inference_batcher> batcher;
  // Timeline trace: acting (stepping environments on the device), offering
  // the unroll to the queue, or waiting for the first weights.
  trace::state_track track;
  static inline const char* name = "rl_actor";
};

rl_actor_actor::behavior_type rl_actor(rl_actor_actor::stateful_pointer<rl_actor_state> self,
                                       rl_actor_config cfg);

// Spawns an rl_actor (its mailbox hand-over visible to ThreadSanitizer).
rl_actor_actor spawn_rl_actor(caf::actor_system& sys, rl_actor_config cfg);

// The seed of actor `index`'s stream of action samples in a job seeded
// `job_seed`: a local actor's, and the inference server's for that actor.
uint64_t actor_sampling_seed(uint64_t job_seed, int64_t index);

// One action per row of `outputs` ([rows, head.outputs()]) sampled from
// `head`'s distribution, drawing from `rng` row by row: discrete ones into
// `discrete` (softmax; `probs` is scratch; with epsilon >= 0 epsilon-greedy
// on the outputs as Q-values, Ape-X's), a Box's into `box` [rows, dims]
// (Gaussian, unclipped; epsilon does not apply). Local inference and the
// inference server both choose actions through it.
void sample_policy_actions(const policy_head& head, const float* outputs, int64_t rows,
                           double epsilon, splitmix64& rng, std::vector<float>& probs,
                           int32_t* discrete, float* box);

// Copies weights into the policy, in variable order (an error names a
// mismatch in count or shape).
void install_policy_weights(policy_value_model& net, const policy_weights& w);

// An unroll of T steps to be filled, its x_0 the current observations.
unroll begin_unroll(rl_actor_compute& c, int64_t actor, int64_t T);

// Step t of an unroll whose actions (and behaviour logits) at t are chosen:
// one batch step of the environments; the episodes that ended go into
// `episodes`. After the last step the observations carry over.
void step_unroll(rl_actor_compute& c, unroll& u, int64_t t, episode_report& episodes);

// One unroll of T steps of `c`'s environments under its policy, continuing
// from c.obs; the finished episodes go into `episodes`. (The device task of
// an rl_actor; exposed for benchmarks and tests.)
unroll act_unroll(rl_actor_compute& c, int64_t actor, int64_t policy_version, int64_t T,
                  episode_report& episodes);

// An unroll's n-step transitions (models/dqn.hpp) with initial priorities
// |R + discount * max_a Q(x', a) - Q(x, a)| under c's network, which acted
// the unroll (its behaviour outputs are Q(x, .)). Ape-X computes them on the
// actors so that new transitions are sampled by their surprise at once.
transition_batch prioritized_transitions(rl_actor_compute& c, const unroll& u, int64_t n,
                                         double discount);
// The same priorities from Q(x', .) given as q_next [B, A] (central
// inference: the server's outputs on b's next observations).
void set_initial_priorities(transition_batch& b, const unroll& u, const float* q_next, int64_t A);

// An rl_actor's device state: environments reset from `seed`, a policy
// ending in `head` (none: the one the environment's actions take)
// initialised from `model_seed`. Without `with_policy` (central inference:
// the server acts) no network is built; c.net stays null.
void init_rl_actor_compute(rl_actor_compute& c, const envs::env_choice& env, int64_t envs,
                           const model_config& model, uint64_t seed, uint64_t model_seed,
                           const std::optional<policy_head>& head = std::nullopt,
                           bool with_policy = true);

}  // namespace troupe
