// The Gaussian policy head: its variables and outputs, backward against
// finite differences, log-probabilities and IMPALA's loss by hand and
// against finite differences, a restore that replaces the buffers.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/cpu_kernels.hpp"
#include "models/gaussian_policy.hpp"
#include "models/policy_value.hpp"
#include "models/random.hpp"
#include "policy_fixtures.hpp"

using namespace troupe;

using test::probe;
using test::random_floats;

namespace {

const policy_head two_dims{action_distribution::gaussian, 2, -0.5};

// The central difference of f at x along element i (steps of 0.001).
template <class F>
double central_difference(std::vector<float> x, std::size_t i, F f) {
  const float eps = 1e-3f, keep = x[i];
  x[i] = keep + eps;
  const double up = f(x);
  x[i] = keep - eps;
  return (up - f(x)) / (2 * eps);
}

}  // namespace

TEST_CASE("gaussian policy: variables, outputs, and backward against finite differences") {
  kernels::init_cpu_kernels();
  const int64_t obs_n = 3, b = 5, P = two_dims.outputs();
  auto m = create_policy_value_model(test::policy_value_config("tanh"), obs_n, two_dims, 7);
  CHECK(m->distribution() == action_distribution::gaussian);
  auto& vars = m->variables();
  REQUIRE(vars.size() == 9);
  CHECK(vars[4].name == "policy/kernel");
  CHECK(vars[4].value.shape() == shape_t{6, 2});  // one mean per dimension
  CHECK(vars[8].name == "policy/log_std");
  CHECK(vars[8].value.shape() == shape_t{2});
  CHECK(vars[8].value.f32()[1] == -0.5f);
  auto obs = random_floats(static_cast<std::size_t>(b * obs_n), 1, 1.0);
  std::vector<float> out(static_cast<std::size_t>(b * P)), values(static_cast<std::size_t>(b));
  m->forward(obs.data(), b, out.data(), values.data());
  for (int64_t r = 0; r < b; ++r) {
    CHECK(out[static_cast<std::size_t>(r * P + 2)] == -0.5f);  // the log-stds follow the means
    CHECK(out[static_cast<std::size_t>(r * P + 3)] == -0.5f);
  }
  auto dout = random_floats(out.size(), 2, 1.0);
  auto dv = random_floats(values.size(), 3, 1.0);
  auto grads = m->make_gradients();
  m->backward(obs.data(), b, dout.data(), dv.data(), grads, false);
  CHECK(test::check_finite_differences(*m, grads, [&] { return probe(*m, obs, b, P, dout, dv); }) >
        20);
  // The log-std's gradient is the sum of its columns' over the rows.
  double sum = 0;
  for (int64_t r = 0; r < b; ++r) sum += dout[static_cast<std::size_t>(r * P + 3)];
  CHECK(grads[8].value.f32()[1] == doctest::Approx(sum).epsilon(1e-6));
  m->backward(obs.data(), b, dout.data(), dv.data(), grads, true);  // accumulates
  CHECK(grads[8].value.f32()[1] == doctest::Approx(2 * sum).epsilon(1e-6));
}

TEST_CASE("gaussian policy: a restore that replaces the variables' buffers is what it computes") {
  kernels::init_cpu_kernels();
  auto m = create_policy_value_model(test::policy_value_config("tanh"), 3, two_dims, 7);
  auto& vars = m->variables();
  // As restore_variables_and_slots does: new buffers, not new contents.
  tensor bias = vars[5].value.clone();
  bias.f32()[0] = 0.75f;
  vars[5].value = bias;
  tensor log_std = vars[8].value.clone();
  log_std.f32()[0] = 0.25f;
  vars[8].value = log_std;
  vars[4].value = tensor(vars[4].value.shape());  // policy kernel zero: the means are the bias
  const std::vector<float> obs = {0.1f, -0.2f, 0.3f};
  std::vector<float> out(4), value(1);
  m->forward(obs.data(), 1, out.data(), value.data());
  CHECK(out[0] == 0.75f);
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == 0.25f);
}

TEST_CASE("gaussian log-probabilities and IMPALA's loss: by hand and finite differences") {
  // One dimension: mean 0.5, sigma 2, action 1.5 (z = 0.5).
  const std::vector<float> one = {0.5f, static_cast<float>(std::log(2.0))};
  const float a = 1.5f;
  float logp = 0;
  gaussian_log_probs(one.data(), &a, 1, 1, &logp);
  const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);
  CHECK(logp == doctest::Approx(-0.125 - std::log(2.0) - half_log_2pi).epsilon(1e-6));
  const int64_t n = 4, D = 2;
  auto outputs = random_floats(static_cast<std::size_t>(n * 2 * D), 5, 1.0);
  auto actions = random_floats(static_cast<std::size_t>(n * D), 6, 2.0);
  auto values = random_floats(static_cast<std::size_t>(n), 7, 1.0);
  auto vs = random_floats(static_cast<std::size_t>(n), 8, 1.0);
  auto adv = random_floats(static_cast<std::size_t>(n), 9, 1.0);
  const double bc = 0.5, ec = 0.01;
  auto loss = [&](const std::vector<float>& o, const std::vector<float>& v, float* dout,
                  float* dv) {
    return gaussian_loss_and_gradients(o.data(), v.data(), actions.data(), vs.data(), adv.data(), n,
                                       D, bc, ec, dout, dv);
  };
  std::vector<float> dout(outputs.size()), dv(values.size()), scratch(outputs.size()),
      scratch_v(values.size());
  const auto r = loss(outputs, values, dout.data(), dv.data());
  // By hand: log N(a; mu, sigma), H = sum_d log sigma_d + 0.5 log(2 pi e).
  double policy = 0, entropy = 0, baseline = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t d = 0; d < D; ++d) {
      const double mu = outputs[static_cast<std::size_t>(t * 2 * D + d)];
      const double ls = outputs[static_cast<std::size_t>(t * 2 * D + D + d)];
      const double x = actions[static_cast<std::size_t>(t * D + d)];
      const double lp = -(x - mu) * (x - mu) / (2 * std::exp(2 * ls)) - ls - half_log_2pi;
      policy -= adv[static_cast<std::size_t>(t)] * lp;
      entropy += ls + 0.5 + half_log_2pi;
    }
    const double err = values[static_cast<std::size_t>(t)] - vs[static_cast<std::size_t>(t)];
    baseline += bc * 0.5 * err * err;
  }
  CHECK(r.policy == doctest::Approx(policy).epsilon(1e-6));
  CHECK(r.entropy == doctest::Approx(entropy).epsilon(1e-6));
  CHECK(r.baseline == doctest::Approx(baseline).epsilon(1e-6));
  CHECK(r.total == doctest::Approx(policy + baseline - ec * entropy).epsilon(1e-6));
  std::vector<float> lps(static_cast<std::size_t>(n));
  gaussian_log_probs(outputs.data(), actions.data(), n, D, lps.data());
  double from_logp = 0;
  for (int64_t t = 0; t < n; ++t)
    from_logp -= adv[static_cast<std::size_t>(t)] * lps[static_cast<std::size_t>(t)];
  CHECK(from_logp == doctest::Approx(policy).epsilon(1e-5));
  auto total = [&](const std::vector<float>& o, const std::vector<float>& v) {
    return loss(o, v, scratch.data(), scratch_v.data()).total;
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    CAPTURE(i);
    const double numeric = central_difference(
        outputs, i, [&](const std::vector<float>& o) { return total(o, values); });
    CHECK(dout[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double numeric = central_difference(
        values, i, [&](const std::vector<float>& v) { return total(outputs, v); });
    CHECK(dv[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
}
