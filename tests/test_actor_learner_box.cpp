// actor_learner with a Box action space (the Gaussian policy head): the
// learner's gradients against finite differences, normalised advantages,
// the rl_actor's unrolls against a replay of its environments, unrolls that
// do not fit the head, the config rules, and Pendulum-v1 learned.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "actors/rl_actor.hpp"
#include "envs/env.hpp"
#include "envs/policy_head.hpp"
#include "fixtures.hpp"
#include "kernels/cpu_kernels.hpp"
#include "models/gaussian_policy.hpp"
#include "models/impala.hpp"
#include "models/random.hpp"
#include "runtime/job.hpp"

using namespace troupe;

namespace {

model_config tiny() {
  model_config m;
  m.kind = "policy_value_mlp";
  m.hidden = {8};
  m.activation = "tanh";
  return m;
}

// An unroll of random observations, Box actions and rewards off policy
// (behaviour means and log-stds random), with one termination and one
// truncation in it.
unroll random_box_unroll(int64_t actor, int64_t T, int64_t M, int64_t O, int64_t D, uint64_t seed) {
  splitmix64 g(seed);
  unroll u;
  u.actor = actor;
  u.observations = tensor({T + 1, M, O});
  u.actions = tensor({T, M, D});
  u.rewards = tensor({T, M});
  u.terminated = tensor({T, M}, dtype::i32);
  u.truncated = tensor({T, M}, dtype::i32);
  u.final_observations = tensor({T, M, O});
  u.behaviour_logits = tensor({T, M, 2 * D});
  for (int64_t i = 0; i < u.observations.numel(); ++i)
    u.observations.f32()[i] = static_cast<float>(g.normal());
  for (int64_t i = 0; i < u.actions.numel(); ++i)
    u.actions.f32()[i] = static_cast<float>(g.normal());
  for (int64_t i = 0; i < T * M; ++i) u.rewards.f32()[i] = static_cast<float>(g.normal());
  for (int64_t i = 0; i < T * M; ++i)
    for (int64_t d = 0; d < 2 * D; ++d)  // means near 0, log-stds near -0.3
      u.behaviour_logits.f32()[i * 2 * D + d] =
          static_cast<float>(d < D ? 0.3 * g.normal() : -0.3 + 0.1 * g.normal());
  u.terminated.data<int32_t>()[1 * M + 0] = 1;
  u.truncated.data<int32_t>()[(T - 2) * M + (M - 1)] = 1;
  for (int64_t k = 0; k < O; ++k)
    u.final_observations.f32()[((T - 2) * M + (M - 1)) * O + k] = static_cast<float>(g.normal());
  return u;
}

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
  auto net = create_policy_value_model(tiny(), O, box_head, 7);
  std::vector<unroll> batch{random_box_unroll(0, T, M, O, D, 1),
                            random_box_unroll(1, T, M, O, D, 2)};
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
  auto& vars = net->variables();
  int checked = 0;
  for (std::size_t v = 0; v < vars.size(); ++v) {
    float* p = vars[v].value.f32();
    for (int64_t i = 0; i < vars[v].value.numel(); i += 3) {
      const float keep = p[i];
      const float eps = 1e-2f;
      p[i] = keep + eps;
      const double up = fixed_target_loss(*net, ws, n, D, s, n);
      p[i] = keep - eps;
      const double down = fixed_target_loss(*net, ws, n, D, s, n);
      p[i] = keep;
      CAPTURE(vars[v].name);
      CAPTURE(i);
      CHECK(grads[v].value.f32()[i] ==
            doctest::Approx((up - down) / (2 * eps)).epsilon(2e-2).scale(1e-3));
      ++checked;
    }
  }
  CHECK(checked > 20);
  CHECK(vars.back().name == "policy/log_std");
  CHECK(grads.back().value.f32()[0] != 0.0f);
}

TEST_CASE("impala: rl.normalize_advantages gives the batch's advantages mean 0 and sd 1") {
  kernels::init_cpu_kernels();
  auto net = create_policy_value_model(tiny(), 4, box_head, 7);
  std::vector<unroll> batch{random_box_unroll(0, 5, 4, 4, 2, 3)};
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
  auto gaussian = create_policy_value_model(tiny(), 4, box_head, 5);
  auto softmax = create_policy_value_model(tiny(), 4, 4, 5);  // 4 logits: same output width
  auto u = random_box_unroll(7, 3, 2, 4, 2, 1);
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
  init_rl_actor_compute(c, "Pendulum-v1", M, tiny(), 99, 3,
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

TEST_CASE("actor_learner: the policy head must fit the environment's action space") {
  auto base = nlohmann::json::parse(R"({"strategy": {"kind": "actor_learner"},
      "model": {"kind": "policy_value_mlp"}, "training": {"max_env_steps": 1000}})");
  auto bad = [&](const std::string& patch) {
    auto j = base;
    j.merge_patch(nlohmann::json::parse(patch));
    try {
      parse_job_config(j);
    } catch (const config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(bad(R"({"rl": {"env": "Pendulum-v1"}})") == "no error");
  CHECK(bad(R"({"rl": {"env": "MountainCar-v0", "policy_head": "softmax"}})") == "no error");
  CHECK(bad(R"({"rl": {"env": "Pendulum-v1", "policy_head": "softmax"}})") ==
        R"(rl.policy_head: the "softmax" policy head does not fit Pendulum-v1, whose actions )"
        R"(are Box(1) in [-2, 2]: use "gaussian" (or "auto"))");
  CHECK(bad(R"({"rl": {"env": "CartPole-v1", "policy_head": "gaussian"}})") ==
        R"(rl.policy_head: the "gaussian" policy head does not fit CartPole-v1, whose actions )"
        R"(are Discrete(2): use "softmax" (or "auto"))");
  CHECK(bad(R"({"rl": {"policy_head": "beta"}})") ==
        R"(rl.policy_head: expected one of "auto", "softmax", "gaussian", got "beta")");
  CHECK(bad(R"({"rl": {"initial_log_std": 3}})") ==
        "rl.initial_log_std: expected a number in [-10, 2], got 3");
  CHECK(bad(R"({"rl": {"normalize_advantages": 1}})") ==
        "rl.normalize_advantages: expected true or false, got 1");
  CHECK(bad(R"({"rl": {"env": "Pendulum-v2"}})") ==
        R"(rl.env: expected one of "Acrobot-v1", "CartPole-v1", "MountainCar-v0", )"
        R"("MountainCarContinuous-v0", "Pendulum-v1", got "Pendulum-v2")");
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
