#include "models/dqn.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace troupe {

double apex_epsilon(int64_t actor, int64_t actors, double eps, double alpha) {
  if (actors <= 1) return eps;
  const double share = static_cast<double>(actor) / static_cast<double>(actors - 1);
  return std::pow(eps, 1.0 + share * alpha);
}

int32_t epsilon_greedy(const float* q, int64_t A, double eps, splitmix64& rng) {
  if (rng.uniform() < eps)
    return static_cast<int32_t>(std::min<int64_t>(A - 1, static_cast<int64_t>(rng.uniform() * A)));
  return static_cast<int32_t>(std::max_element(q, q + A) - q);
}

namespace {

// Where the n-step return from step t of environment m stops: its horizon
// h, what it bootstraps from (a row of x or of the final observations) and
// the discount that bootstrap gets.
struct horizon {
  double ret = 0, discount = 0;
  const float* next = nullptr;
};

horizon nstep_from(const unroll& u, int64_t t, int64_t m, int64_t n, double gamma) {
  const int64_t T = u.steps(), M = u.envs(), O = u.observations.dim(2);
  horizon h;
  double g = 1;
  for (int64_t k = 0; k < n && t + k < T; ++k) {
    const int64_t row = (t + k) * M + m;
    h.ret += g * u.rewards.f32()[row];
    g *= gamma;
    if (u.terminated.data<int32_t>()[row]) {
      h.next = u.final_observations.f32() + row * O;  // any row: discount 0
      return h;
    }
    if (u.truncated.data<int32_t>()[row]) {
      h.next = u.final_observations.f32() + row * O;
      h.discount = g;
      return h;
    }
  }
  h.next = u.observations.f32() + (std::min(t + n, T) * M + m) * O;
  h.discount = g;
  return h;
}

}  // namespace

transition_batch nstep_transitions(const unroll& u, int64_t n, double discount,
                                   float initial_priority) {
  if (n < 1) throw std::invalid_argument("nstep_transitions: n must be >= 1");
  const int64_t T = u.steps(), M = u.envs(), O = u.observations.dim(2), B = T * M;
  transition_batch b;
  b.observations = tensor::uninitialized({B, O});
  b.next_observations = tensor::uninitialized({B, O});
  b.actions = tensor::uninitialized({B}, dtype::i32);
  b.returns = tensor::uninitialized({B});
  b.discounts = tensor::uninitialized({B});
  b.priorities = tensor::uninitialized({B});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t row = t * M + m;
      const float* x = u.observations.f32() + row * O;
      std::copy(x, x + O, b.observations.f32() + row * O);
      const auto h = nstep_from(u, t, m, n, discount);
      std::copy(h.next, h.next + O, b.next_observations.f32() + row * O);
      b.actions.data<int32_t>()[row] = u.actions.data<int32_t>()[row];
      b.returns.f32()[row] = static_cast<float>(h.ret);
      b.discounts.f32()[row] = static_cast<float>(h.discount);
      b.priorities.f32()[row] = initial_priority;
    }
  return b;
}

namespace {

int64_t argmax(const float* q, int64_t A) {
  return std::max_element(q, q + A) - q;
}

// The bootstrap targets y_i, with the online network choosing the action
// and the target network valuing it (double DQN's decoupling, which curbs
// Q-learning's overestimation).
void double_dqn_targets(policy_value_model& online, policy_value_model& target,
                        const transition_batch& b, int64_t A, dqn_workspace& ws) {
  const int64_t B = b.size();
  const float* next = b.next_observations.f32();
  target.forward(next, B, ws.q_next_target.data(), ws.values.data());
  online.forward(next, B, ws.q_next_online.data(), ws.values.data());
  for (int64_t i = 0; i < B; ++i) {
    const int64_t a = argmax(ws.q_next_online.data() + i * A, A);
    ws.targets[static_cast<std::size_t>(i)] =
        b.returns.f32()[i] +
        b.discounts.f32()[i] * ws.q_next_target[static_cast<std::size_t>(i * A + a)];
  }
}

}  // namespace

dqn_figures double_dqn_gradients(policy_value_model& online, policy_value_model& target, int64_t A,
                                 const transition_batch& b, const float* weights, int64_t global,
                                 std::vector<named_tensor>& grads, float* abs_td,
                                 dqn_workspace& ws) {
  const int64_t B = b.size();
  const auto rows = static_cast<std::size_t>(B);
  for (auto* v : {&ws.q, &ws.q_next_online, &ws.q_next_target, &ws.dq}) v->assign(rows * A, 0.0f);
  ws.values.assign(rows, 0.0f);
  ws.dvalues.assign(rows, 0.0f);
  ws.targets.assign(rows, 0.0f);
  double_dqn_targets(online, target, b, A, ws);
  // The online forward on x comes last: backward() uses what it kept.
  online.forward(b.observations.f32(), B, ws.q.data(), ws.values.data());
  dqn_figures f;
  f.samples = B;
  const double scale = 1.0 / static_cast<double>(std::max<int64_t>(global, 1));
  for (int64_t i = 0; i < B; ++i) {
    const int64_t a = b.actions.data<int32_t>()[i];
    const double q = ws.q[static_cast<std::size_t>(i * A + a)];
    const double td = ws.targets[static_cast<std::size_t>(i)] - q;
    const double w = weights ? weights[i] : 1.0;
    const double abs = std::abs(td);
    f.loss += w * (abs <= 1 ? 0.5 * td * td : abs - 0.5);
    f.q_mean += q;
    f.td_abs += abs;
    // d huber(y - q) / dq = -clip(td, -1, 1).
    ws.dq[static_cast<std::size_t>(i * A + a)] =
        static_cast<float>(-w * std::clamp(td, -1.0, 1.0) * scale);
    abs_td[i] = static_cast<float>(abs);
  }
  online.backward(b.observations.f32(), B, ws.dq.data(), ws.dvalues.data(), grads, false);
  return f;
}

}  // namespace troupe
