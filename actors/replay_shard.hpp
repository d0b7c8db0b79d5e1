#pragma once
// replay_shard: one shard of Ape-X's prioritized replay (Horgan et al. 2018;
// protocol: replay_shard_actor in messages/rl_messages.hpp). A ring buffer
// of `capacity` n-step transitions, evicting the oldest once full, and a
// sum_tree over their priorities: rl_actors insert with initial priorities,
// learners sample in proportion to priority^alpha, get importance weights
// under beta, and send new priorities back. A job runs N shards; each is an
// actor of its own, so inserts and samples of different shards never wait
// on one lock.
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "kernels/sum_tree.hpp"
#include "messages/rl_messages.hpp"
#include "models/random.hpp"

namespace troupe {

struct replay_shard_config {
  int64_t index = 0;
  int64_t capacity = 1 << 16;  // transitions held at most (>= 1)
  double alpha = 0.6;          // priority exponent (0: uniform)
  double beta = 0.4;           // importance-weight exponent (0: none)
  int64_t min_size = 1;        // below this many held, samples are answered empty
  // Rate limiter (> 0): past min_size, an insert is answered only once
  // transitions sampled >= samples_per_insert * (inserted - min_size).
  // The answer is the actors' credit, so acting slows to the learners'
  // pace instead of flooding replay with transitions nobody trains on.
  double samples_per_insert = 0;
  int64_t observation_size = 1;
  int64_t actions = 2;  // discrete actions
  uint64_t seed = 0;
};

// The transitions, stored column by column in slots [0, capacity).
struct replay_storage {
  std::vector<float> observations, next_observations;  // [capacity, O]
  std::vector<int32_t> actions;
  std::vector<float> returns, discounts;
};

struct replay_shard_state {
  replay_shard_config cfg;
  sum_tree tree{1};
  replay_storage store;
  splitmix64 rng{0};
  replay_stats stats;
  // Inserts stored but not yet answered (the rate limiter).
  std::deque<std::pair<int64_t, caf::typed_response_promise<int64_t>>> held;
  static inline const char* name = "replay_shard";
};

replay_shard_actor::behavior_type replay_shard(
    replay_shard_actor::stateful_pointer<replay_shard_state> self, replay_shard_config cfg);

// Throws std::invalid_argument naming the bad setting; spawns the shard.
replay_shard_actor spawn_replay_shard(caf::actor_system& sys, replay_shard_config cfg);

}  // namespace troupe
