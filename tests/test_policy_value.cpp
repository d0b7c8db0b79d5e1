// The policy/value network and IMPALA's loss: gradients against finite
// differences, the heads' shapes and names, the loss's terms by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cpu_kernels.hpp"
#include "models/policy_value.hpp"
#include "models/random.hpp"
#include "policy_fixtures.hpp"

using namespace troupe;

using test::policy_value_config;
using test::probe;
using test::random_floats;

TEST_CASE("policy_value_mlp: variables, shapes, and backward against finite differences") {
  kernels::init_cpu_kernels();
  for (std::string act : {"tanh", "relu"}) {
    CAPTURE(act);
    const int64_t obs_n = 4, actions = 3, b = 5;
    auto m = create_policy_value_model(policy_value_config(act), obs_n, actions, 7);
    auto& vars = m->variables();
    REQUIRE(vars.size() == 8);
    CHECK(vars[0].name == "torso_0/kernel");
    CHECK(vars[4].name == "policy/kernel");
    CHECK(vars[4].value.shape() == shape_t{6, 3});
    CHECK(vars[6].name == "value/kernel");
    CHECK(vars[6].value.shape() == shape_t{6, 1});
    auto obs = random_floats(static_cast<std::size_t>(b * obs_n), 1, 1.0);
    auto dl = random_floats(static_cast<std::size_t>(b * actions), 2, 1.0);
    auto dv = random_floats(static_cast<std::size_t>(b), 3, 1.0);
    std::vector<float> logits(static_cast<std::size_t>(b * actions)), values(b);
    m->forward(obs.data(), b, logits.data(), values.data());
    auto grads = m->make_gradients();
    m->backward(obs.data(), b, dl.data(), dv.data(), grads);
    // A ReLU network is piecewise linear in each weight: its one-sided
    // differences agree unless a kink lies within the step, and such an
    // element is not a fair test (few are). tanh is smooth: central
    // differences.
    auto differences = [&](float* w, float eps) {
      const float keep = *w;
      const double at = probe(*m, obs, b, actions, dl, dv);
      *w = keep + eps;
      const double up = probe(*m, obs, b, actions, dl, dv);
      *w = keep - eps;
      const double down = probe(*m, obs, b, actions, dl, dv);
      *w = keep;
      return std::pair<double, double>((up - at) / eps, (at - down) / eps);
    };
    int checked = 0, kinks = 0;
    for (std::size_t v = 0; v < vars.size(); ++v) {
      float* w = vars[v].value.f32();
      for (int64_t i = 0; i < vars[v].value.numel(); i += 3) {
        CAPTURE(vars[v].name);
        CAPTURE(i);
        const auto [right, left] = differences(w + i, 1e-2f);
        const double central = (right + left) / 2;
        if (act == "relu" && std::abs(right - left) > 0.02 * std::max(1e-2, std::abs(central))) {
          ++kinks;
          continue;
        }
        ++checked;
        CHECK(grads[v].value.f32()[i] == doctest::Approx(central).epsilon(2e-2).scale(1e-2));
      }
    }
    CHECK(kinks * 10 <= checked);
  }
}

namespace {

// A smooth network's gradients (backward) against central differences of
// sum(dl . logits) + sum(dv . values), every third element of every variable.
void check_against_differences(policy_value_model& net, int64_t obs_n, int64_t actions) {
  const int64_t b = 5;
  auto& vars = net.variables();
  auto obs = random_floats(static_cast<std::size_t>(b * obs_n), 1, 1.0);
  auto dl = random_floats(static_cast<std::size_t>(b * actions), 2, 1.0);
  auto dv = random_floats(static_cast<std::size_t>(b), 3, 1.0);
  std::vector<float> logits(static_cast<std::size_t>(b * actions)), values(b);
  net.forward(obs.data(), b, logits.data(), values.data());
  auto grads = net.make_gradients();
  net.backward(obs.data(), b, dl.data(), dv.data(), grads);
  for (std::size_t v = 0; v < vars.size(); ++v) {
    float* w = vars[v].value.f32();
    for (int64_t i = 0; i < vars[v].value.numel(); i += 3) {
      CAPTURE(vars[v].name);
      CAPTURE(i);
      const float keep = w[i];
      w[i] = keep + 1e-2f;
      const double up = probe(net, obs, b, actions, dl, dv);
      w[i] = keep - 1e-2f;
      const double down = probe(net, obs, b, actions, dl, dv);
      w[i] = keep;
      CHECK(grads[v].value.f32()[i] ==
            doctest::Approx((up - down) / 2e-2).epsilon(2e-2).scale(1e-2));
    }
  }
}

}  // namespace

TEST_CASE("policy_value_layers: a layer torso, its heads, backward against finite differences") {
  model_config c;
  c.kind = "policy_value_layers";
  c.layers = nlohmann::json::parse(R"([{"type": "dense", "units": 8}, {"type": "layer_norm"},
                                       {"type": "gelu"}, {"type": "dense", "units": 6},
                                       {"type": "tanh"}])");
  const int64_t obs_n = 4, actions = 3;
  auto m = create_policy_value_model(c, obs_n, actions, 7);
  auto& vars = m->variables();
  REQUIRE(vars.size() == 10);
  CHECK(vars[0].name == "dense_0/kernel");
  CHECK(vars[2].name == "layer_norm_0/gamma");
  CHECK(vars[6].name == "policy/kernel");
  CHECK(vars[6].value.shape() == shape_t{6, 3});
  CHECK(vars[8].value.shape() == shape_t{6, 1});
  check_against_differences(*m, obs_n, actions);
  // A torso that does not end in a vector, or keeps statistics, is refused.
  c.layers = nlohmann::json::parse(R"([{"type": "reshape", "shape": [2, 2]}])");
  CHECK_THROWS_WITH(create_policy_value_model(c, obs_n, actions, 7),
                    "model.layers: the torso must end in a [features] vector (flatten), got [2,2]");
  c.layers = nlohmann::json::parse(R"([{"type": "dense", "units": 4}, {"type": "batch_norm"}])");
  CHECK_THROWS_WITH(create_policy_value_model(c, obs_n, actions, 7),
                    doctest::Contains("batch_norm has no place in an actor/learner torso"));
}

// A conv after a reshape of the observation (the conv torso's start,
// envs/torso.hpp): the stack skips the conv's gradient for the input, and
// the parameters' gradients stay right.
TEST_CASE("policy_value_layers: a conv torso over a reshaped observation, against differences") {
  model_config c;
  c.kind = "policy_value_layers";
  c.layers = nlohmann::json::parse(R"([{"type": "reshape", "shape": [2, 5, 5]},
      {"type": "conv2d", "filters": 3, "kernel": 3, "stride": 2}, {"type": "tanh"},
      {"type": "flatten"}, {"type": "dense", "units": 4}, {"type": "tanh"}])");
  const int64_t obs_n = 50, actions = 3;
  auto m = create_policy_value_model(c, obs_n, actions, 11);
  REQUIRE(m->variables()[0].value.shape() == shape_t{3, 2, 3, 3});
  CHECK(m->input_size() == obs_n);
  check_against_differences(*m, obs_n, actions);
}

TEST_CASE("IMPALA loss: terms by hand, gradients against finite differences") {
  const int64_t n = 4, a = 3;
  auto logits = random_floats(static_cast<std::size_t>(n * a), 5, 2.0);
  auto values = random_floats(static_cast<std::size_t>(n), 6, 1.0);
  auto vs = random_floats(static_cast<std::size_t>(n), 7, 1.0);
  auto adv = random_floats(static_cast<std::size_t>(n), 8, 1.0);
  const std::vector<int32_t> actions = {0, 2, 1, 2};
  const double bc = 0.5, ec = 0.01;
  std::vector<float> dl(static_cast<std::size_t>(n * a)), dv(static_cast<std::size_t>(n));
  auto loss = [&](const std::vector<float>& z, const std::vector<float>& v) {
    std::vector<float> l2(dl.size()), v2(dv.size());
    return impala_loss_and_gradients(z.data(), v.data(), actions.data(), vs.data(), adv.data(), n,
                                     a, bc, ec, l2.data(), v2.data());
  };
  auto r = impala_loss_and_gradients(logits.data(), values.data(), actions.data(), vs.data(),
                                     adv.data(), n, a, bc, ec, dl.data(), dv.data());
  // By hand: softmax, log-probabilities, entropy.
  double policy = 0, baseline = 0, entropy = 0;
  for (int64_t t = 0; t < n; ++t) {
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < a; ++j) m = std::max(m, double(logits[t * a + j]));
    for (int64_t j = 0; j < a; ++j) s += std::exp(logits[t * a + j] - m);
    for (int64_t j = 0; j < a; ++j) {
      double lp = logits[t * a + j] - m - std::log(s);
      entropy -= std::exp(lp) * lp;
      if (j == actions[t]) policy -= adv[t] * lp;
    }
    baseline += bc * 0.5 * (vs[t] - values[t]) * (vs[t] - values[t]);
  }
  CHECK(r.policy == doctest::Approx(policy).epsilon(1e-6));
  CHECK(r.baseline == doctest::Approx(baseline).epsilon(1e-6));
  CHECK(r.entropy == doctest::Approx(entropy).epsilon(1e-6));
  CHECK(r.total == doctest::Approx(policy + baseline - ec * entropy).epsilon(1e-6));
  const float eps = 1e-3f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    auto up = logits, down = logits;
    up[i] += eps;
    down[i] -= eps;
    double numeric = (loss(up, values).total - loss(down, values).total) / (2 * eps);
    CHECK(dl[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto up = values, down = values;
    up[i] += eps;
    down[i] -= eps;
    double numeric = (loss(logits, up).total - loss(logits, down).total) / (2 * eps);
    CHECK(dv[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
  std::vector<float> logp(static_cast<std::size_t>(n));
  action_log_probs(logits.data(), actions.data(), n, a, logp.data());
  double lp_sum = 0;
  for (int64_t t = 0; t < n; ++t) lp_sum -= adv[t] * logp[static_cast<std::size_t>(t)];
  CHECK(lp_sum == doctest::Approx(policy).epsilon(1e-5));
  const std::vector<int32_t> bad = {0, 3, 0, 0};
  CHECK_THROWS_WITH_AS(
      impala_loss_and_gradients(logits.data(), values.data(), bad.data(), vs.data(), adv.data(), n,
                                a, bc, ec, dl.data(), dv.data()),
      "impala loss: action 3 at step 1 is out of range [0, 3)", std::out_of_range);
}

TEST_CASE("policy/value models by name; bad configs named") {
  model_config c = policy_value_config("tanh");
  c.kind = "transformer";
  CHECK_THROWS_WITH_AS(create_policy_value_model(c, 4, 2, 1),
                       "model.kind: unknown policy/value model 'transformer' (registered: "
                       "policy_value_layers, policy_value_mlp)",
                       std::invalid_argument);
  c = policy_value_config("gelu");
  CHECK_THROWS_AS(create_policy_value_model(c, 4, 2, 1), std::invalid_argument);
  c = policy_value_config("tanh");
  c.hidden.clear();
  CHECK_THROWS_WITH_AS(create_policy_value_model(c, 4, 2, 1),
                       "model.hidden: policy_value_mlp needs at least one layer",
                       std::invalid_argument);
  // The first policy is near uniform (small policy head).
  auto m = create_policy_value_model(policy_value_config("tanh"), 4, 2, 3);
  std::vector<float> obs = {0.1f, -0.2f, 0.03f, 0.5f}, logits(2), values(1);
  m->forward(obs.data(), 1, logits.data(), values.data());
  CHECK(std::abs(logits[0] - logits[1]) < 0.05f);
}
