#pragma once
// Actor/learner RL's message vocabulary and the trajectory queue's protocol:
// what rl_actors send the learners (unrolls) through the queue
// (actors/trajectory_queue.hpp), in one place.
#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "messages/messages.hpp"
#include "messages/protocols.hpp"

namespace troupe {

using enqueue_atom = caf::atom_constant<caf::atom("enqueue")>;
using dequeue_atom = caf::atom_constant<caf::atom("dequeue")>;
using version_atom = caf::atom_constant<caf::atom("version")>;
using weights_atom = caf::atom_constant<caf::atom("weights")>;
using episodes_atom = caf::atom_constant<caf::atom("episodes")>;
using learned_atom = caf::atom_constant<caf::atom("learned")>;
using halt_atom = caf::atom_constant<caf::atom("halt")>;

// One actor's unroll: T steps of its M environments, time-major, with what
// a learner needs for V-trace (kernels/vtrace.hpp).
struct unroll {
  int64_t actor = 0;
  int64_t policy_version = 0;  // of the weights that chose the actions
  tensor observations;         // [T + 1, M, obs] f32: x_0 .. x_T (x_T to bootstrap)
  tensor actions;              // [T, M] i32; a Box's: [T, M, dims] f32, unclipped
  tensor rewards;              // [T, M] f32
  tensor terminated;           // [T, M] i32: 1 where step t ended the episode (no value after)
  tensor truncated;            // [T, M] i32: 1 where the time limit cut the episode
  tensor final_observations;   // [T, M, obs] f32: the last observation where an episode ended
  // [T, M, actions] f32: the acting policy's logits; a Gaussian policy's
  // [T, M, 2 dims]: its means, then its log-stds.
  tensor behaviour_logits;
  int64_t steps() const { return actions.rank() >= 2 ? actions.dim(0) : 0; }
  int64_t envs() const { return actions.rank() >= 2 ? actions.dim(1) : 0; }
};

// The shape of every unroll of a job: T steps of M environments with
// observations of O floats and A discrete actions, or (action_dims > 0)
// actions in a Box of that many dimensions.
struct unroll_shape {
  int64_t steps = 0, envs = 0, observation_size = 0, actions = 0, action_dims = 0;
};

// Why `u` does not fit `s` (a tensor's shape or type, an action out of
// range, a flag other than 0 or 1, a number that is not finite), or "" when
// it fits. Unrolls come from other processes: the queue checks every one
// before a learner sees it.
std::string unroll_problem(const unroll& u, const unroll_shape& s);

// A trajectory queue's counters since it started.
struct queue_stats {
  int64_t depth = 0;  // unrolls waiting for a learner
  int64_t capacity = 0;
  int64_t enqueued = 0;           // accepted
  int64_t dequeued = 0;           // handed to learners
  int64_t dropped_stale = 0;      // older than max_policy_lag versions
  int64_t refused = 0;            // malformed (unroll_problem)
  int64_t waiting_producers = 0;  // actors held back (no room)
  int64_t waiting_consumers = 0;  // learners waiting for a batch
  int64_t policy_version = 0;     // the latest the learners announced
};

// The policy's variables in the model's order (models/policy_value.hpp),
// and how many updates made them. In one process every actor gets the same
// buffers (one copy per publication); across processes raw blocks.
struct policy_weights {
  int64_t version = 0;
  std::vector<tensor> values;
  int64_t member = 0;  // rl.population: the member whose learner made them (else 0)
};

// What an rl_actor reports after each unroll: the environment steps it took
// and the episodes that ended in it.
struct episode_report {
  int64_t actor = 0;
  int64_t env_steps = 0;
  std::vector<double> returns;
  std::vector<int64_t> lengths;
};

// What a learner reports after each update.
struct learner_report {
  int64_t learner = 0;
  int64_t member = 0;   // rl.population: the learner's member (else 0)
  int64_t version = 0;  // updates applied, this one included
  int64_t samples = 0;  // environment steps trained on, over all learners
  double loss = 0;      // per step: policy + baseline_cost * value - entropy_cost * entropy
  double policy_loss = 0;
  double baseline_loss = 0;
  double entropy = 0;    // mean entropy of the policy
  double grad_norm = 0;  // global norm before clipping
  double lag_mean = 0;   // versions between the acting policy and this update
  int64_t lag_max = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, policy_weights& x) {
  return f(caf::meta::type_name("policy_weights"), x.version, x.values, x.member);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, episode_report& x) {
  return f(caf::meta::type_name("episode_report"), x.actor, x.env_steps, x.returns, x.lengths);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, learner_report& x) {
  return f(caf::meta::type_name("learner_report"), x.learner, x.member, x.version, x.samples,
           x.loss, x.policy_loss, x.baseline_loss, x.entropy, x.grad_norm, x.lag_mean, x.lag_max);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, unroll& x) {
  return f(caf::meta::type_name("unroll"), x.actor, x.policy_version, x.observations, x.actions,
           x.rewards, x.terminated, x.truncated, x.final_observations, x.behaviour_logits);
}
// What the inference server has run since it started: batches (and those
// that had waited max_wait_us when they ran: a full batch, or one every live
// actor asked in, runs at once), their rows, and the batches of requests
// from actors in its own process (through its batcher, no message).
struct inference_stats {
  int64_t batches = 0;
  int64_t overdue_batches = 0;
  int64_t rows = 0;
  int64_t in_process_batches = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inference_stats& x) {
  return f(caf::meta::type_name("inference_stats"), x.batches, x.overdue_batches, x.rows,
           x.in_process_batches);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, queue_stats& x) {
  return f(caf::meta::type_name("queue_stats"), x.depth, x.capacity, x.enqueued, x.dequeued,
           x.dropped_stale, x.refused, x.waiting_producers, x.waiting_consumers, x.policy_version);
}

// trajectory_queue (actors/trajectory_queue.hpp): a bounded queue of unrolls
// between rl_actors and learners. It never blocks a thread: a request that
// cannot be served yet is answered later, and that answer is the back-pressure.
using trajectory_queue_actor = caf::typed_actor<
    // An actor's unroll. Answered with the depth after it was queued, once
    // there is room: an actor waits for the answer before it sends its next
    // unroll, so no mailbox grows without bound. Answered with -1 when the
    // unroll is older than max_policy_lag versions (dropped, counted), with
    // an error naming the problem when it is malformed (refused, counted).
    caf::replies_to<enqueue_atom, unroll>::with<int64_t>,
    // A learner's batch of n unrolls, oldest first, answered once n fresh
    // ones are there (stale ones are dropped on the way out too).
    caf::replies_to<dequeue_atom, int64_t>::with<std::vector<unroll>>,
    // The learners' current policy version (staleness is measured against it).
    caf::reacts_to<version_atom, int64_t>, caf::replies_to<stats_atom>::with<queue_stats>>;

// rl_actor (actors/rl_actor.hpp): M environments and a copy of the policy on
// a device thread, acting in unrolls of T steps.
using rl_actor_actor = caf::typed_actor<
    // Start acting (the first weights come with or before it).
    caf::reacts_to<run_atom>,
    // Newer weights: installed between unrolls (an unroll is acted by one
    // version); older or equal versions are ignored.
    caf::reacts_to<weights_atom, policy_weights>,
    // Internal: a device task finished (actors/device_tasks.hpp).
    caf::reacts_to<computed_atom, uint64_t>>;

// Central inference (rl.inference "central", SEED RL; the protocol in one
// place). Per unroll step an rl_actor sends the observations of its M
// environments and waits for the answer: the actions sampled from the
// policy's outputs under the learner's newest weights, and those outputs
// (V-trace's behaviour logits). The inference server
// (actors/inference_server.hpp) batches the requests of every actor into one
// forward; learner 0 hands it its weights after every update (in-process:
// the weights never cross a process boundary). Sampling draws from a stream
// per actor, seeded as a local actor's, so an actor's actions do not depend
// on which other requests share its batch.
using infer_atom = caf::atom_constant<caf::atom("infer")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;

struct inference_request {
  int64_t actor = 0;
  // The actor's request count since it started: 0 (a new or restarted
  // actor) restarts its sampling stream.
  int64_t step = 0;
  tensor observations;  // [M, obs] f32
  // >= 0: the outputs are Q-values and the actions epsilon-greedy under it
  // (Ape-X); < 0: sampled from the policy head.
  double epsilon = -1;
  // The outputs only (no actions, the sampling stream untouched): Ape-X's
  // bootstrap Q-values for an unroll's initial priorities.
  bool outputs_only = false;
};

struct inference_reply {
  int64_t policy_version = 0;  // of the weights that computed the outputs
  tensor actions;              // [M] i32; a Box's: [M, dims] f32, unclipped
  tensor outputs;              // [M, actions] f32 logits; a Gaussian's [M, 2 dims]
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inference_request& x) {
  return f(caf::meta::type_name("inference_request"), x.actor, x.step, x.observations, x.epsilon,
           x.outputs_only);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inference_reply& x) {
  return f(caf::meta::type_name("inference_reply"), x.policy_version, x.actions, x.outputs);
}

using inference_server_actor = caf::typed_actor<
    // One step of one actor: answered once its batch ran (a batch runs when
    // it holds rl.central.max_batch rows, every live actor has asked, or
    // rl.central.max_wait_us passed), or with an error naming the problem
    // (observations of the wrong shape).
    caf::replies_to<infer_atom, inference_request>::with<inference_reply>,
    // Learner 0's weights after an update (older or equal versions are
    // ignored); requests wait until the first ones came.
    caf::reacts_to<weights_atom, policy_weights>,
    // Its counters (the driver's metrics lines).
    caf::replies_to<stats_atom>::with<inference_stats>,
    // Internal: the wait of batch n is over; a device task finished.
    caf::reacts_to<flush_atom, int64_t>, caf::reacts_to<computed_atom, uint64_t>>;

// Population-based training (rl.population; the protocol is
// strategies/population.cpp's): what a member's learner trains with, and
// what the population controller is told and answers each round.
using exploit_atom = caf::atom_constant<caf::atom("exploit")>;
using hyperparameters_atom = caf::atom_constant<caf::atom("hyperparam")>;
using round_atom = caf::atom_constant<caf::atom("pbt_round")>;

struct member_hyperparameters {
  double learning_rate = 0;  // the optimizer's (its schedule's base rate)
  double entropy_cost = 0;
};

// A member's standing at a round: the mean return of its recent episodes
// (those since it last exploited, at most 100) and how many there are.
struct member_score {
  int64_t member = 0;
  double mean_return = 0;
  int64_t episodes = 0;
};

// One exploit and explore: `member` took `source`'s weights and optimizer
// state, then its hyperparameters became `after` (`source`'s were `before`).
struct population_event {
  int64_t round = 0;
  int64_t member = 0;
  int64_t source = 0;
  double member_return = 0;
  double source_return = 0;
  member_hyperparameters before, after;
  std::string learning_rate_by;  // "perturbed" or "resampled"
  std::string entropy_cost_by;
};

// A round's answer: its events, and every member's hyperparameters after it.
struct population_round {
  std::vector<population_event> events;
  std::vector<member_hyperparameters> members;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_hyperparameters& x) {
  return f(caf::meta::type_name("member_hyperparameters"), x.learning_rate, x.entropy_cost);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_score& x) {
  return f(caf::meta::type_name("member_score"), x.member, x.mean_return, x.episodes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, population_event& x) {
  return f(caf::meta::type_name("population_event"), x.round, x.member, x.source, x.member_return,
           x.source_return, x.before, x.after, x.learning_rate_by, x.entropy_cost_by);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, population_round& x) {
  return f(caf::meta::type_name("population_round"), x.events, x.members);
}

// learner (actors/learner.hpp): the policy being trained, its optimizer and
// gradients on a device thread; with several learners, each trains on its
// share of every batch and they all-reduce gradients (data parallel).
using learner_actor = caf::typed_actor<
    // Start the loop: dequeue, V-trace and loss, (all-reduce), clip, update.
    caf::reacts_to<run_atom>,
    // The variables and optimizer slots, between updates (checkpoints).
    caf::replies_to<state_atom>::with<model_state>,
    // Puts a checkpoint's state back before run; answered with the version.
    caf::replies_to<restore_atom, model_state>::with<int64_t>,
    // The current weights (for an actor that joins).
    caf::replies_to<weights_atom>::with<policy_weights>,
    // rl.population's exploit (strategies/population.cpp): takes another
    // member's variables and optimizer slots and these hyperparameters
    // between two updates (after the one in flight); answered with the
    // learner's version, which goes on counting (its actors take the weights
    // it publishes next).
    caf::replies_to<exploit_atom, model_state, member_hyperparameters>::with<int64_t>,
    // New hyperparameters from the next update on (a resumed population's).
    caf::reacts_to<hyperparameters_atom, member_hyperparameters>,
    // Stop after the next update (the one in flight, if any). Learners vote
    // in the gradients' all-reduce, so they all stop after the same update;
    // answered with the version then.
    caf::replies_to<halt_atom>::with<int64_t>,
    // Internal: a device task finished (actors/device_tasks.hpp).
    caf::reacts_to<computed_atom, uint64_t>>;

// What actor/learner's roles report to the job's coordinator (its driver,
// strategies/actor_learner.cpp, books them): the coordinator's protocol
// (messages/coordinator_messages.hpp) includes these.
using rl_reports_actor = caf::typed_actor<
    // An actor's unroll is done: its episodes.
    caf::reacts_to<episodes_atom, episode_report>,
    // A learner's update is done.
    caf::reacts_to<learned_atom, learner_report>,
    // Learner 0 publishes weights: forwarded to every live actor.
    caf::reacts_to<weights_atom, policy_weights>>;

// The population controller (rl.population, strategies/population.cpp).
using population_controller_actor = caf::typed_actor<
    // A round: the members' scores; answered once the bottom members took
    // the top ones' state and new hyperparameters.
    caf::replies_to<round_atom, std::vector<member_score>>::with<population_round>,
    // A resumed job's hyperparameters, one per member: the controller's and
    // every member's learner's from now on.
    caf::replies_to<hyperparameters_atom, std::vector<member_hyperparameters>>::with<int64_t>>;

// Ape-X's replay (actors/replay_shard.hpp): n-step transitions with
// priorities, sampled in proportion to priority^alpha.
using insert_atom = caf::atom_constant<caf::atom("insert")>;
using sample_atom = caf::atom_constant<caf::atom("sample")>;
using priority_atom = caf::atom_constant<caf::atom("priority")>;

// B n-step transitions (x_t, a_t, R, gamma^n or 0, x_{t+n}): R is the
// discounted sum of the n rewards after a_t, `discount` what the bootstrap
// value of x_{t+n} is multiplied by (0 when the episode terminated within
// the n steps). Sampled batches carry no priorities.
struct transition_batch {
  tensor observations;       // [B, O] f32
  tensor actions;            // [B] i32
  tensor returns;            // [B] f32
  tensor discounts;          // [B] f32, in [0, 1]
  tensor next_observations;  // [B, O] f32
  tensor priorities;         // [B] f32, >= 0: the initial ones (inserts only)
  int64_t size() const { return actions.rank() == 1 ? actions.dim(0) : 0; }
};

// Why `b` does not fit transitions of O-float observations and A discrete
// actions (a shape, an action out of range, a discount outside [0, 1], a
// negative priority, a number that is not finite), or "" when it fits.
// Inserts come from other processes: a shard checks every one.
std::string transition_problem(const transition_batch& b, int64_t observation_size,
                               int64_t actions);

// A prioritized sample: the transitions, the ids to send new priorities
// back under, and the importance weights (normalised to at most 1).
struct replay_sample {
  transition_batch transitions;
  std::vector<int64_t> ids;  // insertion numbers: an id evicted since is ignored on update
  tensor weights;            // [B] f32
};

// New priorities (|TD error|) for sampled ids, in the same order.
struct priority_update {
  std::vector<int64_t> ids;
  std::vector<float> priorities;
};

// A replay shard's counters since it started.
struct replay_stats {
  int64_t size = 0;  // transitions held
  int64_t capacity = 0;
  int64_t inserted = 0;       // transitions accepted
  int64_t evicted = 0;        // overwritten, oldest first, once full
  int64_t sampled = 0;        // transitions handed out
  int64_t updated = 0;        // priorities updated
  int64_t stale_updates = 0;  // updates for transitions evicted meanwhile (ignored)
  int64_t refused = 0;        // malformed insert batches (transition_problem)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, transition_batch& x) {
  return f(caf::meta::type_name("transition_batch"), x.observations, x.actions, x.returns,
           x.discounts, x.next_observations, x.priorities);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replay_sample& x) {
  return f(caf::meta::type_name("replay_sample"), x.transitions, x.ids, x.weights);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, priority_update& x) {
  return f(caf::meta::type_name("priority_update"), x.ids, x.priorities);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replay_stats& x) {
  return f(caf::meta::type_name("replay_stats"), x.size, x.capacity, x.inserted, x.evicted,
           x.sampled, x.updated, x.stale_updates, x.refused);
}

// replay_shard (actors/replay_shard.hpp): one shard of Ape-X's prioritized
// replay. Actors insert, learners sample and send priorities back; shards
// share nothing, so there is no lock for them to contend on.
using replay_shard_actor = caf::typed_actor<
    // A batch of transitions with their initial priorities; answered with
    // the shard's size after it, or an error naming the problem (refused,
    // counted). Once full, the oldest transitions are overwritten.
    caf::replies_to<insert_atom, transition_batch>::with<int64_t>,
    // n transitions drawn in proportion to priority^alpha, with their ids
    // and importance weights under beta; an empty sample (no ids) while the
    // shard holds fewer than its min_size (replay warms up).
    caf::replies_to<sample_atom, int64_t>::with<replay_sample>,
    // New priorities for sampled ids; ids evicted meanwhile are ignored.
    caf::reacts_to<priority_atom, priority_update>,
    caf::replies_to<stats_atom>::with<replay_stats>>;

// Registers the types above with CAF (register_messages calls it).
void register_rl_messages(caf::actor_system_config& cfg);

}  // namespace troupe
