#pragma once
// Actor/learner RL's message vocabulary and the trajectory queue's protocol:
// what rl_actors send the learners (unrolls) through the queue
// (actors/trajectory_queue.hpp), in one place.
#include <caf/all.hpp>
#include <cstdint>
#include <vector>

#include "messages/messages.hpp"

namespace troupe {

using enqueue_atom = caf::atom_constant<caf::atom("enqueue")>;
using dequeue_atom = caf::atom_constant<caf::atom("dequeue")>;
using version_atom = caf::atom_constant<caf::atom("version")>;

// One actor's unroll: T steps of its M environments, time-major, with what
// a learner needs for V-trace (kernels/vtrace.hpp).
struct unroll {
  int64_t actor = 0;
  int64_t policy_version = 0;  // of the weights that chose the actions
  tensor observations;         // [T + 1, M, obs] f32: x_0 .. x_T (x_T to bootstrap)
  tensor actions;              // [T, M] i32
  tensor rewards;              // [T, M] f32
  tensor terminated;           // [T, M] i32: 1 where step t ended the episode (no value after)
  tensor truncated;            // [T, M] i32: 1 where the time limit cut the episode
  tensor final_observations;   // [T, M, obs] f32: the last observation where an episode ended
  tensor behaviour_logits;     // [T, M, actions] f32: the acting policy's logits
  int64_t steps() const { return actions.rank() == 2 ? actions.dim(0) : 0; }
  int64_t envs() const { return actions.rank() == 2 ? actions.dim(1) : 0; }
};

// A trajectory queue's counters since it started.
struct queue_stats {
  int64_t depth = 0;  // unrolls waiting for a learner
  int64_t capacity = 0;
  int64_t enqueued = 0;           // accepted
  int64_t dequeued = 0;           // handed to learners
  int64_t dropped_stale = 0;      // older than max_policy_lag versions
  int64_t waiting_producers = 0;  // actors held back (no room)
  int64_t waiting_consumers = 0;  // learners waiting for a batch
  int64_t policy_version = 0;     // the latest the learners announced
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, unroll& x) {
  return f(caf::meta::type_name("unroll"), x.actor, x.policy_version, x.observations, x.actions,
           x.rewards, x.terminated, x.truncated, x.final_observations, x.behaviour_logits);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, queue_stats& x) {
  return f(caf::meta::type_name("queue_stats"), x.depth, x.capacity, x.enqueued, x.dequeued,
           x.dropped_stale, x.waiting_producers, x.waiting_consumers, x.policy_version);
}

// trajectory_queue (actors/trajectory_queue.hpp): a bounded queue of unrolls
// between rl_actors and learners. It never blocks a thread: a request that
// cannot be served yet is answered later, and that answer is the back-pressure.
using trajectory_queue_actor = caf::typed_actor<
    // An actor's unroll. Answered with the depth after it was queued, once
    // there is room: an actor waits for the answer before it sends its next
    // unroll, so no mailbox grows without bound. Answered with -1 when the
    // unroll is older than max_policy_lag versions (dropped, counted).
    caf::replies_to<enqueue_atom, unroll>::with<int64_t>,
    // A learner's batch of n unrolls, oldest first, answered once n fresh
    // ones are there (stale ones are dropped on the way out too).
    caf::replies_to<dequeue_atom, int64_t>::with<std::vector<unroll>>,
    // The learners' current policy version (staleness is measured against it).
    caf::reacts_to<version_atom, int64_t>, caf::replies_to<stats_atom>::with<queue_stats>>;

// Registers the types above with CAF (register_messages calls it).
void register_rl_messages(caf::actor_system_config& cfg);

}  // namespace troupe
