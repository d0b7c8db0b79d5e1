// actor_learner with a Box action space (the Gaussian policy head): the
// learner's gradients against finite differences, normalised advantages,
// the rl_actor's unrolls against a replay of its environments, unrolls that
// do not fit the head, and Pendulum-v1 learned (the config rules are with
// the others in test_actor_learner.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "actors/rl_actor.hpp"
#include "checkpoint/checkpoint.hpp"
#include "envs/env.hpp"
#include "envs/policy_head.hpp"
#include "fixtures.hpp"
#include "kernels/cpu_kernels.hpp"
#include "models/gaussian_policy.hpp"
#include "models/impala.hpp"
#include "models/random.hpp"
#include "policy_fixtures.hpp"
#include "runtime/job.hpp"

using namespace troupe;
using troupe::test::random_unroll;
using troupe::test::tiny_model;

namespace {

// The Gaussian loss with the workspace's V-trace targets held fixed,
// divided by the global batch.
double fixed_target_loss(policy_value_model& net, const impala_workspace& ws, int64_t n, int64_t D,
                         const impala_settings& s, int64_t global) {
  std::vector<float> out(static_cast<std::size_t>(n * 2 * D)), values(static_cast<std::size_t>(n));
  std::vector<float> dout(out.size()), dv(values.size());
  net.forward(ws.obs.data(), n, out.data(), values.data());
  auto l = gaussian_loss_and_gradients(out.data(), values.data(), ws.box_actions.data(),
                                       ws.vs.data(), ws.advantages.data(), n, D, s.baseline_cost,
                                       s.entropy_cost, dout.data(), dv.data());
  return l.total / static_cast<double>(global);
}

const policy_head box_head{action_distribution::gaussian, 2, -0.3};

}  // namespace

TEST_CASE("impala (Gaussian head): the learner's gradients match finite differences") {
  kernels::init_cpu_kernels();
  const int64_t T = 4, M = 3, O = 4, D = 2;
  auto net = create_policy_value_model(tiny_model(), O, box_head, 7);
  std::vector<unroll> batch{random_unroll(0, T, M, O, 0, 1, nullptr, D),
                            random_unroll(1, T, M, O, 0, 2, nullptr, D)};
  impala_settings s;
  s.discount = 0.9;
  s.entropy_cost = 0.05;
  impala_workspace ws;
  auto grads = net->make_gradients();
  const int64_t n = 2 * T * M;
  auto fig = impala_gradients(*net, batch, s, n, 1, grads, ws);
  CHECK(fig.samples == n);
  // Entropy: sum over the steps of sum_d (log sigma_d + 0.5 log(2 pi e)).
  CHECK(fig.entropy ==
        doctest::Approx(n * D * (-0.3 + 0.5 * std::log(2 * M_PI * std::exp(1.0)))).epsilon(1e-5));
  const int checked = test::check_finite_differences(
      *net, grads, [&] { return fixed_target_loss(*net, ws, n, D, s, n); });
  CHECK(checked > 20);
  auto& vars = net->variables();
  CHECK(vars.back().name == "policy/log_std");
  CHECK(grads.back().value.f32()[0] != 0.0f);
}

TEST_CASE("impala: rl.normalize_advantages gives the batch's advantages mean 0 and sd 1") {
  kernels::init_cpu_kernels();
  auto net = create_policy_value_model(tiny_model(), 4, box_head, 7);
  std::vector<unroll> batch{random_unroll(0, 5, 4, 4, 0, 3, nullptr, 2)};
  impala_settings s;
  s.normalize_advantages = true;
  impala_workspace ws;
  auto grads = net->make_gradients();
  impala_gradients(*net, batch, s, 20, 0, grads, ws);
  const double n = static_cast<double>(ws.advantages.size());
  const double mean = std::accumulate(ws.advantages.begin(), ws.advantages.end(), 0.0) / n;
  double sq = 0;
  for (float a : ws.advantages) sq += (a - mean) * (a - mean);
  CHECK(std::abs(mean) < 1e-6);
  CHECK(std::sqrt(sq / n) == doctest::Approx(1).epsilon(1e-4));
  s.normalize_advantages = false;
  impala_gradients(*net, batch, s, 20, 0, grads, ws);
  double raw = 0;
  for (float a : ws.advantages) raw += a * a;
  CHECK(std::abs(std::sqrt(raw / n) - 1) > 0.05);  // this batch's were not so already
}

TEST_CASE("impala: unrolls that do not fit the policy head are refused naming them") {
  auto gaussian = create_policy_value_model(tiny_model(), 4, box_head, 5);
  auto softmax = create_policy_value_model(tiny_model(), 4, 4, 5);  // 4 logits: same output width
  auto u = random_unroll(7, 3, 2, 4, 0, 1, nullptr, 2);
  impala_workspace ws;
  auto g = softmax->make_gradients();
  CHECK_THROWS_WITH(impala_gradients(*softmax, {u}, {}, 6, 0, g, ws),
                    doctest::Contains("unroll 0 (actor 7): actions has shape [3, 2, 2] float32, "
                                      "expected [3, 2] int32"));
  auto discrete = u;
  discrete.actions = tensor({3, 2}, dtype::i32);
  auto gg = gaussian->make_gradients();
  CHECK_THROWS_WITH(
      impala_gradients(*gaussian, {discrete}, {}, 6, 0, gg, ws),
      doctest::Contains("actions has shape [3, 2] int32, expected [3, 2, 2] float32"));
  auto nan = u;
  nan.actions.f32()[3] = NAN;
  CHECK_THROWS_WITH(impala_gradients(*gaussian, {nan}, {}, 6, 0, gg, ws),
                    doctest::Contains("actions[3] is not a finite number"));
}

TEST_CASE("rl_actor (Pendulum-v1): unrolls of sampled, unclipped actions, replayed") {
  kernels::init_cpu_kernels();
  rl_actor_compute c;
  const int64_t M = 8, T = 50;
  init_rl_actor_compute(c, "Pendulum-v1", M, tiny_model(), 99, 3,
                        policy_head{action_distribution::gaussian, 1, 0.5});
  episode_report eps;
  auto u = act_unroll(c, 1, 2, T, eps);
  CHECK(u.actions.shape() == shape_t{T, M, 1});
  CHECK(u.actions.type() == dtype::f32);
  CHECK(u.behaviour_logits.shape() == shape_t{T, M, 2});
  CHECK(unroll_problem(u, {T, M, 3, 0, 1}).empty());
  // The behaviour's log-std is the initial one; the samples spread around
  // the means with sigma = e^0.5 ~ 1.65, some beyond the bounds of 2.
  double sum = 0, sq = 0;
  int beyond = 0;
  for (int64_t i = 0; i < T * M; ++i) {
    REQUIRE(u.behaviour_logits.f32()[i * 2 + 1] == 0.5f);
    const double z = u.actions.f32()[i] - u.behaviour_logits.f32()[i * 2];
    sum += z;
    sq += z * z;
    beyond += std::abs(u.actions.f32()[i]) > 2 ? 1 : 0;
  }
  const double n = static_cast<double>(T * M);
  CHECK(std::abs(sum / n) < 0.25);
  CHECK(std::sqrt(sq / n) == doctest::Approx(std::exp(0.5)).epsilon(0.1));
  CHECK(beyond > 0);
  // Replay: the same seed and actions give the same rewards (the
  // environment clips the actions itself).
  auto env = envs::make_env("Pendulum-v1", M);
  std::vector<float> obs(M * 3), fin(M * 3), rew(M);
  std::vector<uint8_t> term(M), trunc(M);
  std::vector<double> ret(M);
  std::vector<int64_t> len(M);
  env->reset(99, obs.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < M * 3; ++k) REQUIRE(u.observations.f32()[t * M * 3 + k] == obs[k]);
    envs::step_output out{obs.data(), rew.data(), term.data(), trunc.data(),
                          fin.data(), ret.data(), len.data()};
    env->step_box(u.actions.f32() + t * M, out);
    for (int64_t m = 0; m < M; ++m) CHECK(u.rewards.f32()[t * M + m] == rew[m]);
  }
}

namespace {

// The first "policy/log_std" of a checkpoint.
float log_std_of(const checkpoint::snapshot& s) {
  for (const auto& v : s.variables)
    if (v.name == "policy/log_std") return v.value.f32()[0];
  FAIL("the checkpoint holds no policy/log_std");
  return 0;
}

}  // namespace

TEST_CASE("actor_learner: a Gaussian policy's checkpoint holds its log-std and resumes") {
  test::temp_dir tmp;
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/pendulum_impala.json");
  c.logging.output_dir = tmp / "run";
  c.logging.level = "warn";
  c.training = {};
  c.training.max_steps = 30;
  c.checkpoint.every_steps = 30;
  c.rl.initial_log_std = -0.7;
  auto first = run_job(c, {});
  CHECK(first["updates"] == 30);
  auto snap = checkpoint::load(first["checkpoint"].get<std::string>());
  CHECK(snap.variables.size() == 9);  // 64-64 torso, policy and value heads, log-std
  const float log_std = log_std_of(snap);
  CHECK(log_std != -0.7f);  // trained
  CHECK(std::abs(log_std + 0.7f) < 0.5f);
  c.training.max_steps = 50;
  job_options o;
  o.resume = true;
  auto second = run_job(c, o);
  CHECK(second["updates"] == 50);
  CHECK(second["env_steps"].get<int64_t>() > first["env_steps"].get<int64_t>());
  auto after = checkpoint::load(second["checkpoint"].get<std::string>());
  CHECK(log_std_of(after) != log_std);
}

namespace {

// A random policy's mean return on Pendulum-v1: torques uniform in [-2, 2].
double random_policy_return(int64_t episodes) {
  auto env = envs::make_env("Pendulum-v1", episodes);
  const auto n = static_cast<std::size_t>(episodes);
  std::vector<float> obs(n * 3), fin(n * 3), rew(n), a(n);
  std::vector<uint8_t> term(n), trunc(n);
  std::vector<double> ret(n);
  std::vector<int64_t> len(n);
  env->reset(5, obs.data());
  splitmix64 g(6);
  double total = 0;
  for (int t = 0; t < 200; ++t) {
    for (auto& x : a) x = static_cast<float>(4 * g.uniform() - 2);
    env->step_box(a.data(), {obs.data(), rew.data(), term.data(), trunc.data(), fin.data(),
                             ret.data(), len.data()});
  }
  for (double r : ret) total += r;
  return total / static_cast<double>(episodes);
}

}  // namespace

TEST_CASE("actor_learner: Pendulum-v1 learns with the Gaussian head (examples/pendulum_impala)") {
  const double random_return = random_policy_return(100);
  CHECK(random_return < -1000);
  test::temp_dir tmp;
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/pendulum_impala.json");
  c.logging.output_dir = tmp / "run";
  c.logging.level = "warn";
  c.training.max_env_steps = 3000000;  // the example solves it in about 2 million
  auto s = run_job(c, {});
  CHECK(s["env"] == "Pendulum-v1");
  CHECK(s["env_steps"].get<int64_t>() <= 3000000 + 4 * 16 * 16);
  // Far better than random: the pendulum is swung up and held.
  CHECK(s["best_mean_return_100"].get<double>() >= -400);
  CHECK(s["best_mean_return_100"].get<double>() > random_return + 600);
}
