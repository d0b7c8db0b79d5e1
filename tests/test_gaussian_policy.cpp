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

using namespace troupe;

namespace {

std::vector<float> uniform_floats(std::size_t n, uint64_t seed, double scale) {
  splitmix64 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((g.uniform() * 2 - 1) * scale);
  return v;
}

model_config small_mlp() {
  model_config c;
  c.kind = "policy_value_mlp";
  c.hidden = {8, 6};
  c.activation = "tanh";
  return c;
}

const policy_head two_dims{action_distribution::gaussian, 2, -0.5};

// sum_b (dout[b] . outputs[b] + dv[b] values[b]) in double.
double probe(policy_value_model& m, const std::vector<float>& obs, int64_t b,
             const std::vector<float>& dout, const std::vector<float>& dv) {
  std::vector<float> out(dout.size()), values(static_cast<std::size_t>(b));
  m.forward(obs.data(), b, out.data(), values.data());
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += double(dout[i]) * out[i];
  for (std::size_t i = 0; i < values.size(); ++i) s += double(dv[i]) * values[i];
  return s;
}

}  // namespace

TEST_CASE("gaussian policy: variables, outputs, and backward against finite differences") {
  kernels::init_cpu_kernels();
  const int64_t obs_n = 3, b = 5, P = two_dims.outputs();
  auto m = create_policy_value_model(small_mlp(), obs_n, two_dims, 7);
  CHECK(m->distribution() == action_distribution::gaussian);
  auto& vars = m->variables();
  REQUIRE(vars.size() == 9);
  CHECK(vars[4].name == "policy/kernel");
  CHECK(vars[4].value.shape() == shape_t{6, 2});  // one mean per dimension
  CHECK(vars[8].name == "policy/log_std");
  CHECK(vars[8].value.shape() == shape_t{2});
  CHECK(vars[8].value.f32()[1] == -0.5f);
  auto obs = uniform_floats(static_cast<std::size_t>(b * obs_n), 1, 1.0);
  std::vector<float> out(static_cast<std::size_t>(b * P)), values(static_cast<std::size_t>(b));
  m->forward(obs.data(), b, out.data(), values.data());
  for (int64_t r = 0; r < b; ++r) {
    CHECK(out[static_cast<std::size_t>(r * P + 2)] == -0.5f);  // the log-stds follow the means
    CHECK(out[static_cast<std::size_t>(r * P + 3)] == -0.5f);
  }
  auto dout = uniform_floats(out.size(), 2, 1.0);
  auto dv = uniform_floats(values.size(), 3, 1.0);
  auto grads = m->make_gradients();
  m->backward(obs.data(), b, dout.data(), dv.data(), grads, false);
  const float eps = 1e-2f;
  for (std::size_t k : {std::size_t{0}, std::size_t{4}, std::size_t{5}, std::size_t{8}}) {
    CAPTURE(vars[k].name);
    float* w = vars[k].value.f32();
    for (int64_t i = 0; i < std::min<int64_t>(vars[k].value.numel(), 6); ++i) {
      const float keep = w[i];
      w[i] = keep + eps;
      const double up = probe(*m, obs, b, dout, dv);
      w[i] = keep - eps;
      const double down = probe(*m, obs, b, dout, dv);
      w[i] = keep;
      CHECK(grads[k].value.f32()[i] == doctest::Approx((up - down) / (2 * eps)).epsilon(2e-2));
    }
  }
  // The log-std's gradient is the sum of its columns' over the rows.
  double sum = 0;
  for (int64_t r = 0; r < b; ++r) sum += dout[static_cast<std::size_t>(r * P + 3)];
  CHECK(grads[8].value.f32()[1] == doctest::Approx(sum).epsilon(1e-6));
  m->backward(obs.data(), b, dout.data(), dv.data(), grads, true);  // accumulates
  CHECK(grads[8].value.f32()[1] == doctest::Approx(2 * sum).epsilon(1e-6));
}

TEST_CASE("gaussian policy: a restore that replaces the variables' buffers is what it computes") {
  kernels::init_cpu_kernels();
  auto m = create_policy_value_model(small_mlp(), 3, two_dims, 7);
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
  auto outputs = uniform_floats(static_cast<std::size_t>(n * 2 * D), 5, 1.0);
  auto actions = uniform_floats(static_cast<std::size_t>(n * D), 6, 2.0);
  auto values = uniform_floats(static_cast<std::size_t>(n), 7, 1.0);
  auto vs = uniform_floats(static_cast<std::size_t>(n), 8, 1.0);
  auto adv = uniform_floats(static_cast<std::size_t>(n), 9, 1.0);
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
  const float eps = 1e-3f;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    CAPTURE(i);
    auto up = outputs, down = outputs;
    up[i] += eps;
    down[i] -= eps;
    const double numeric = (loss(up, values, scratch.data(), scratch_v.data()).total -
                            loss(down, values, scratch.data(), scratch_v.data()).total) /
                           (2 * eps);
    CHECK(dout[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto up = values, down = values;
    up[i] += eps;
    down[i] -= eps;
    const double numeric = (loss(outputs, up, scratch.data(), scratch_v.data()).total -
                            loss(outputs, down, scratch.data(), scratch_v.data()).total) /
                           (2 * eps);
    CHECK(dv[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
}
