#pragma once
// What the policy/value and actor/learner tests share: small networks,
// random inputs and unrolls, a probe of a network's outputs, and gradients
// checked against central differences of a loss.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "messages/rl_messages.hpp"
#include "models/policy_value.hpp"
#include "models/random.hpp"

namespace troupe::test {

// Uniform in [-scale, scale).
inline std::vector<float> random_floats(std::size_t n, uint64_t seed, double scale) {
  splitmix64 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((g.uniform() * 2 - 1) * scale);
  return v;
}

// A bundled example's job (examples/NAME), writing into `out`, logging
// warnings only: what the RL job tests run.
inline job_config quiet_example_job(const std::string& name, const std::string& out) {
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/" + name);
  c.logging.output_dir = out;
  c.logging.level = "warn";
  return c;
}

inline model_config policy_value_config(const std::string& activation,
                                        std::vector<int64_t> hidden = {8, 6}) {
  model_config c;
  c.kind = "policy_value_mlp";
  c.hidden = std::move(hidden);
  c.activation = activation;
  return c;
}

inline model_config tiny_model() {
  return policy_value_config("tanh", {8});
}

// sum_b (dl[b] . outputs[b] + dv[b] values[b]) in double, for outputs of
// `width` per row.
inline double probe(policy_value_model& m, const std::vector<float>& obs, int64_t b, int64_t width,
                    const std::vector<float>& dl, const std::vector<float>& dv) {
  std::vector<float> out(static_cast<std::size_t>(b * width)), values(static_cast<std::size_t>(b));
  m.forward(obs.data(), b, out.data(), values.data());
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += double(dl[i]) * out[i];
  for (std::size_t i = 0; i < values.size(); ++i) s += double(dv[i]) * values[i];
  return s;
}

// An unroll of random observations, actions and rewards, with one
// termination and one truncation in it; behaviour logits random too (off
// policy) unless `net` is given (then the network's own: on policy). With
// box_dims > 0 the actions are a Box's (normal) and the behaviour outputs a
// Gaussian's (means near 0, log-stds near -0.3); A is then unused.
inline unroll random_unroll(int64_t actor, int64_t T, int64_t M, int64_t O, int64_t A,
                            uint64_t seed, policy_value_model* net = nullptr,
                            int64_t box_dims = 0) {
  splitmix64 g(seed);
  const int64_t D = box_dims;
  unroll u;
  u.actor = actor;
  u.observations = tensor({T + 1, M, O});
  u.actions = D > 0 ? tensor({T, M, D}) : tensor({T, M}, dtype::i32);
  u.rewards = tensor({T, M});
  u.terminated = tensor({T, M}, dtype::i32);
  u.truncated = tensor({T, M}, dtype::i32);
  u.final_observations = tensor({T, M, O});
  u.behaviour_logits = tensor({T, M, D > 0 ? 2 * D : A});
  for (int64_t i = 0; i < u.observations.numel(); ++i)
    u.observations.f32()[i] = static_cast<float>(g.normal());
  for (int64_t i = 0; i < T * M; ++i) {
    if (D > 0)
      for (int64_t d = 0; d < D; ++d) u.actions.f32()[i * D + d] = static_cast<float>(g.normal());
    else
      u.actions.data<int32_t>()[i] = static_cast<int32_t>(g.next() % static_cast<uint64_t>(A));
    u.rewards.f32()[i] = static_cast<float>(g.normal());
  }
  const int64_t P = u.behaviour_logits.dim(2);
  for (int64_t i = 0; i < u.behaviour_logits.numel(); ++i)
    u.behaviour_logits.f32()[i] = static_cast<float>(
        D == 0 ? g.normal() : (i % P < D ? 0.3 * g.normal() : -0.3 + 0.1 * g.normal()));
  // Env 0 terminates at step 1; env M-1 is truncated at step T-2.
  u.terminated.data<int32_t>()[1 * M + 0] = 1;
  u.truncated.data<int32_t>()[(T - 2) * M + (M - 1)] = 1;
  for (int64_t k = 0; k < O; ++k)
    u.final_observations.f32()[((T - 2) * M + (M - 1)) * O + k] = static_cast<float>(g.normal());
  u.final_observations.f32()[(1 * M + 0) * O] = 5;  // never read (terminated)
  if (net) {
    std::vector<float> values(static_cast<std::size_t>(T * M));
    net->forward(u.observations.f32(), T * M, u.behaviour_logits.f32(), values.data());
  }
  return u;
}

// Every third element of every variable of `net`: its gradient in grads
// against the central difference of loss() (steps of 0.01). Returns how
// many were checked.
inline int check_finite_differences(policy_value_model& net, const std::vector<named_tensor>& grads,
                                    const std::function<double()>& loss) {
  auto& vars = net.variables();
  int checked = 0;
  for (std::size_t v = 0; v < vars.size(); ++v) {
    float* p = vars[v].value.f32();
    for (int64_t i = 0; i < vars[v].value.numel(); i += 3) {
      const float keep = p[i];
      const float eps = 1e-2f;
      p[i] = keep + eps;
      const double up = loss();
      p[i] = keep - eps;
      const double down = loss();
      p[i] = keep;
      CAPTURE(vars[v].name);
      CAPTURE(i);
      CHECK(grads[v].value.f32()[i] ==
            doctest::Approx((up - down) / (2 * eps)).epsilon(2e-2).scale(1e-3));
      ++checked;
    }
  }
  return checked;
}

// `ms` made unlike a fresh learner's state (an exploit's source in the
// population tests): normal draws from `seed` in every variable and
// optimizer slot, the optimizer's step counters at 7.
inline void scramble_state(model_state& ms, uint64_t seed) {
  splitmix64 rng(seed);
  for (auto* list : {&ms.variables, &ms.slots})
    for (auto& v : *list) {
      if (v.value.type() == dtype::i64) {
        v.value.data<int64_t>()[0] = 7;
        continue;
      }
      for (int64_t i = 0; i < v.value.numel(); ++i)
        v.value.f32()[i] = static_cast<float>(rng.normal());
    }
}

}  // namespace troupe::test
