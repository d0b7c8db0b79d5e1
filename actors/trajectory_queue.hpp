#pragma once
// trajectory_queue: the bounded queue between rl_actors and learners
// (protocol: trajectory_queue_actor in messages/rl_messages.hpp). Actors are
// held back by the answer to their enqueue (credit: one unroll in flight per
// actor, `capacity` queued), learners by the answer to their dequeue; with
// max_policy_lag >= 0, unrolls acted by a policy more than that many
// versions behind the learners' are dropped, on the way in and on the way
// out.
#include <cstdint>
#include <deque>

#include <caf/all.hpp>

#include "messages/rl_messages.hpp"

namespace troupe {

struct trajectory_queue_config {
  int64_t capacity = 16;        // unrolls queued at most (>= 1)
  int64_t max_policy_lag = -1;  // -1: keep every unroll
  unroll_shape expect;          // every unroll must fit it (steps 0: unchecked)
};

struct trajectory_queue_state {
  trajectory_queue_config cfg;
  std::deque<unroll> queued;
  std::deque<std::pair<unroll, caf::typed_response_promise<int64_t>>> producers;  // no room yet
  std::deque<std::pair<int64_t, caf::typed_response_promise<std::vector<unroll>>>> consumers;
  queue_stats stats;
  static inline const char* name = "trajectory_queue";
};

trajectory_queue_actor::behavior_type trajectory_queue(
    trajectory_queue_actor::stateful_pointer<trajectory_queue_state> self,
    trajectory_queue_config cfg);

// Throws std::invalid_argument naming the bad setting; spawns the queue.
trajectory_queue_actor spawn_trajectory_queue(caf::actor_system& sys, trajectory_queue_config cfg);

}  // namespace troupe
