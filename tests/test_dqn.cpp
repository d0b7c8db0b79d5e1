// Ape-X DQN's math: per-actor epsilons, epsilon-greedy actions, n-step
// transitions cut from an unroll (terminations, truncations, the unroll's
// end), and double DQN's gradients against finite differences of its loss,
// its targets and its new priorities.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu_kernels.hpp"
#include "models/dqn.hpp"
#include "policy_fixtures.hpp"

using namespace troupe;

TEST_CASE("apex_epsilon: eps^(1 + i/(N-1) alpha), from eps down to eps^(1 + alpha)") {
  CHECK(apex_epsilon(0, 8) == doctest::Approx(0.4));
  CHECK(apex_epsilon(7, 8) == doctest::Approx(std::pow(0.4, 8.0)));
  CHECK(apex_epsilon(2, 5, 0.5, 4.0) == doctest::Approx(std::pow(0.5, 3.0)));
  CHECK(apex_epsilon(0, 1) == doctest::Approx(0.4));
  for (int64_t i = 1; i < 8; ++i) CHECK(apex_epsilon(i, 8) < apex_epsilon(i - 1, 8));
}

TEST_CASE("epsilon_greedy: the argmax at eps 0, uniform at eps 1") {
  splitmix64 rng(3);
  const std::vector<float> q = {0.1f, 2.0f, -1.0f, 2.0f};
  for (int k = 0; k < 100; ++k) CHECK(epsilon_greedy(q.data(), 4, 0.0, rng) == 1);  // first max
  std::vector<int> counts(4, 0);
  for (int k = 0; k < 40000; ++k)
    ++counts[static_cast<std::size_t>(epsilon_greedy(q.data(), 4, 1.0, rng))];
  for (int c : counts) CHECK(c == doctest::Approx(10000).epsilon(0.05));
  // eps 0.2: the argmax 0.8 + 0.2 / 4 of the time.
  int ones = 0;
  for (int k = 0; k < 40000; ++k) ones += epsilon_greedy(q.data(), 4, 0.2, rng) == 1;
  CHECK(ones == doctest::Approx(0.85 * 40000).epsilon(0.02));
}

TEST_CASE("nstep_transitions: returns stop at terminations, bootstrap at truncations and ends") {
  const int64_t T = 4, M = 2, O = 1;
  unroll u;
  u.observations = tensor({T + 1, M, O});
  u.actions = tensor({T, M}, dtype::i32);
  u.rewards = tensor({T, M});
  u.terminated = tensor({T, M}, dtype::i32);
  u.truncated = tensor({T, M}, dtype::i32);
  u.final_observations = tensor({T, M, O});
  for (int64_t t = 0; t <= T; ++t)
    for (int64_t m = 0; m < M; ++m)
      u.observations.f32()[t * M + m] = static_cast<float>(10 * t + m);
  for (int64_t i = 0; i < T * M; ++i) {
    u.rewards.f32()[i] = 1;
    u.actions.data<int32_t>()[i] = static_cast<int32_t>(i % 2);
  }
  u.terminated.data<int32_t>()[1 * M + 0] = 1;  // env 0 ends at step 1
  u.truncated.data<int32_t>()[2 * M + 1] = 1;   // env 1 is cut at step 2
  u.final_observations.f32()[2 * M + 1] = -7;
  const auto b = nstep_transitions(u, 3, 0.5, 2.0f);
  REQUIRE(b.size() == T * M);
  CHECK(transition_problem(b, O, 2).empty());
  struct expect {
    int64_t t, m;
    float ret, discount, next;
  };
  for (auto e : {expect{0, 0, 1.5f, 0.0f, 0}, expect{1, 0, 1.0f, 0.0f, 0},
                 expect{2, 0, 1.5f, 0.25f, 40}, expect{3, 0, 1.0f, 0.5f, 40},
                 expect{0, 1, 1.75f, 0.125f, -7}, expect{1, 1, 1.5f, 0.25f, -7},
                 expect{2, 1, 1.0f, 0.5f, -7}, expect{3, 1, 1.0f, 0.5f, 41}}) {
    CAPTURE(e.t);
    CAPTURE(e.m);
    const int64_t row = e.t * M + e.m;
    CHECK(b.observations.f32()[row] == static_cast<float>(10 * e.t + e.m));
    CHECK(b.returns.f32()[row] == doctest::Approx(e.ret));
    CHECK(b.discounts.f32()[row] == doctest::Approx(e.discount));
    if (e.discount > 0) CHECK(b.next_observations.f32()[row] == e.next);
    CHECK(b.actions.data<int32_t>()[row] == row % 2);
    CHECK(b.priorities.f32()[row] == 2.0f);
  }
}

namespace {

// The weighted Huber loss with the targets held fixed (they are constants
// of the gradient), divided by the global batch.
double fixed_target_loss(policy_value_model& net, const transition_batch& b, const float* w,
                         const std::vector<float>& y, int64_t A, int64_t global) {
  const int64_t B = b.size();
  std::vector<float> q(static_cast<std::size_t>(B * A)), v(static_cast<std::size_t>(B));
  net.forward(b.observations.f32(), B, q.data(), v.data());
  double loss = 0;
  for (int64_t i = 0; i < B; ++i) {
    const double td = y[static_cast<std::size_t>(i)] -
                      q[static_cast<std::size_t>(i * A + b.actions.data<int32_t>()[i])];
    loss += w[i] * (std::abs(td) <= 1 ? 0.5 * td * td : std::abs(td) - 0.5);
  }
  return loss / static_cast<double>(global);
}

}  // namespace

TEST_CASE("double_dqn_gradients: finite differences, targets, priorities") {
  kernels::init_cpu_kernels();
  const int64_t T = 4, M = 3, O = 4, A = 3;
  auto online = create_policy_value_model(test::tiny_model(), O, A, 7);
  auto target = create_policy_value_model(test::tiny_model(), O, A, 8);
  auto u = test::random_unroll(0, T, M, O, A, 5);
  auto b = nstep_transitions(u, 3, 0.9);
  const int64_t B = b.size();
  std::vector<float> w(static_cast<std::size_t>(B));
  for (int64_t i = 0; i < B; ++i)
    w[static_cast<std::size_t>(i)] = 0.3f + 0.05f * static_cast<float>(i);
  auto grads = online->make_gradients();
  std::vector<float> td(static_cast<std::size_t>(B));
  dqn_workspace ws;
  const int64_t global = 2 * B;
  auto f = double_dqn_gradients(*online, *target, A, b, w.data(), global, grads, td.data(), ws);
  CHECK(f.samples == B);
  const int checked = test::check_finite_differences(*online, grads, [&] {
    return fixed_target_loss(*online, b, w.data(), ws.targets, A, global);
  });
  CHECK(checked > 20);
  // y = R + discount * Q_target(x', argmax_a Q_online(x', a)), by hand.
  std::vector<float> qo(static_cast<std::size_t>(A)), qt(static_cast<std::size_t>(A)), v(1);
  std::vector<float> q(static_cast<std::size_t>(A));
  for (int64_t i = 0; i < B; ++i) {
    online->forward(b.next_observations.f32() + i * O, 1, qo.data(), v.data());
    target->forward(b.next_observations.f32() + i * O, 1, qt.data(), v.data());
    const auto a = static_cast<std::size_t>(std::max_element(qo.begin(), qo.end()) - qo.begin());
    const double y = b.returns.f32()[i] + b.discounts.f32()[i] * qt[a];
    CHECK(ws.targets[static_cast<std::size_t>(i)] == doctest::Approx(y).epsilon(1e-4));
    online->forward(b.observations.f32() + i * O, 1, q.data(), v.data());
    const double qa = q[static_cast<std::size_t>(b.actions.data<int32_t>()[i])];
    CHECK(td[static_cast<std::size_t>(i)] == doctest::Approx(std::abs(y - qa)).epsilon(1e-4));
  }
}
