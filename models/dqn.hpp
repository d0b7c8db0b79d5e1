#pragma once
// Ape-X DQN's math (Horgan et al. 2018), apart from the actors that run it:
// each actor's exploration rate, epsilon-greedy actions, n-step transitions
// cut from an rl_actor's unroll, and the learner's double-DQN gradients
// (van Hasselt et al. 2016) with importance weights and the new priorities.
// A policy/value network serves as the Q-network: its A policy outputs are
// read as Q-values and its value head is left untrained.
#include <cstdint>
#include <vector>

#include "messages/rl_messages.hpp"
#include "models/policy_value.hpp"
#include "models/random.hpp"

namespace troupe {

// Actor i of N's epsilon: eps^(1 + i / (N - 1) * alpha), from eps for actor
// 0 down to eps^(1 + alpha) for the last (Ape-X's 0.4 and 7: 0.4 to 0.00066),
// so that some actors explore while others exploit. One actor gets eps.
double apex_epsilon(int64_t actor, int64_t actors, double eps = 0.4, double alpha = 7.0);

// With probability eps a uniformly random action, otherwise the argmax of
// the row of A Q-values (the first on ties).
int32_t epsilon_greedy(const float* q, int64_t A, double eps, splitmix64& rng);

// The n-step transitions of every step of an unroll of discrete actions,
// time-major over its M environments (row t * M + m):
//   R = sum_{k<h} discount^k r_{t+k}, bootstrapped from x_{t+h} with
//   discount^h, where h = n, or less where the episode ended first (0 when
//   it terminated; from its final observation when truncated) or the unroll
//   ended first (x_T: no step is lost at an unroll's end).
// Priorities are left as `initial_priority` (the actor may set |TD|).
transition_batch nstep_transitions(const unroll& u, int64_t n, double discount,
                                   float initial_priority = 1.0f);

struct dqn_figures {
  int64_t samples = 0;
  double loss = 0;    // sum of w_i * huber(td_i)
  double q_mean = 0;  // sum of Q(x, a) over the batch
  double td_abs = 0;  // sum of |td|
};

struct dqn_workspace {
  std::vector<float> q, q_next_online, q_next_target, values, dq, dvalues;
  std::vector<float> targets;  // y [B], kept for tests
};

// Double DQN on a sampled batch of `actions`-way Q-values: y = R + discount * Q_target(x', argmax_a
// Q_online(x', a)), td = y - Q_online(x, a), loss (1 / global) sum_i w_i
// huber(td_i) (Huber with delta 1: the TD error's gradient is clipped to
// [-1, 1]). Gradients into grads (overwritten); |td_i| into abs_td [B], the
// new priorities. `weights` [B] are the importance weights (nullptr: 1).
dqn_figures double_dqn_gradients(policy_value_model& online, policy_value_model& target,
                                 int64_t actions, const transition_batch& b, const float* weights,
                                 int64_t global, std::vector<named_tensor>& grads, float* abs_td,
                                 dqn_workspace& ws);

}  // namespace troupe
