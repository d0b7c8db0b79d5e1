#include "models/impala.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/vtrace.hpp"
#include "models/gaussian_policy.hpp"

namespace troupe {
namespace {

std::string where(const unroll& u, std::size_t k) {
  return "unroll " + std::to_string(k) + " (actor " + std::to_string(u.actor) + ")";
}

// The batch's sizes, every unroll checked against the first and the network.
// P: policy outputs per row; D: a Box's dimensions (0 for discrete actions).
struct batch_shape {
  int64_t U = 0, T = 0, M = 0, O = 0, P = 0, D = 0;
};

batch_shape check_batch(policy_value_model& net, const std::vector<unroll>& batch) {
  if (batch.empty()) throw std::invalid_argument("impala: empty batch of unrolls");
  const unroll& f = batch.front();
  if (f.observations.rank() != 3 || f.behaviour_logits.rank() != 3 || f.steps() < 1 || f.envs() < 1)
    throw std::invalid_argument(where(f, 0) + ": malformed unroll (observations " +
                                shape_string(f.observations.shape()) + ", actions " +
                                shape_string(f.actions.shape()) + ")");
  batch_shape b{static_cast<int64_t>(batch.size()), f.steps(), f.envs(), f.observations.dim(2),
                f.behaviour_logits.dim(2),          0};
  const bool gaussian = net.distribution() == action_distribution::gaussian;
  if (gaussian) b.D = b.P / 2;
  if (net.input_size() != b.O)
    throw std::invalid_argument(where(f, 0) + ": observations of size " + std::to_string(b.O) +
                                " do not fit the network's input");
  const unroll_shape want =
      gaussian ? unroll_shape{b.T, b.M, b.O, 0, b.D} : unroll_shape{b.T, b.M, b.O, b.P, 0};
  for (std::size_t k = 0; k < batch.size(); ++k)
    if (auto why = unroll_problem(batch[k], want); !why.empty())
      throw std::invalid_argument(where(batch[k], k) + ": " + why);
  return b;
}

// Rows of the forward pass into ws.obs: the N training rows, then the
// bootstrap row x_T of every (u, m) at N + u*M + m, then the final
// observations of episodes the time limit cut (their value is bootstrapped
// from). Returns, per training row, its final observation's row (or -1).
std::vector<int64_t> gather_rows(const std::vector<unroll>& batch, const batch_shape& b,
                                 impala_workspace& ws) {
  const auto [U, T, M, O, P, D] = b;
  const int64_t TM = T * M, N = U * TM, Bc = U * M;
  int64_t F = 0;
  for (const auto& u : batch) {
    const int32_t* term = u.terminated.data<int32_t>();
    const int32_t* trunc = u.truncated.data<int32_t>();
    for (int64_t i = 0; i < TM; ++i) F += (trunc[i] != 0 && term[i] == 0) ? 1 : 0;
  }
  ws.obs.resize(static_cast<std::size_t>((N + Bc + F) * O));
  std::vector<int64_t> final_row(static_cast<std::size_t>(N), -1);
  int64_t next_final = N + Bc;
  for (int64_t k = 0; k < U; ++k) {
    const unroll& u = batch[static_cast<std::size_t>(k)];
    const float* x = u.observations.f32();
    std::copy(x, x + TM * O, ws.obs.data() + k * TM * O);
    std::copy(x + TM * O, x + (TM + M) * O, ws.obs.data() + (N + k * M) * O);
    const int32_t* term = u.terminated.data<int32_t>();
    const int32_t* trunc = u.truncated.data<int32_t>();
    const float* fin = u.final_observations.f32();
    for (int64_t i = 0; i < TM; ++i) {
      if (trunc[i] == 0 || term[i] != 0) continue;
      std::copy(fin + i * O, fin + (i + 1) * O, ws.obs.data() + next_final * O);
      final_row[static_cast<std::size_t>(k * TM + i)] = next_final++;
    }
  }
  return final_row;
}

// log pi(a | x) of the n actions under outputs, discrete (int32) or Box
// (float) actions as the batch's shape says.
void log_probs(const batch_shape& b, const float* outputs, const void* actions, int64_t n,
               float* out) {
  if (b.D > 0)
    gaussian_log_probs(outputs, static_cast<const float*>(actions), n, b.D, out);
  else
    action_log_probs(outputs, static_cast<const int32_t*>(actions), n, b.P, out);
}

// The actions taken into ws, and their log-probabilities under the
// learner's policy and the behaviour policy.
void action_log_probs_of(const std::vector<unroll>& batch, const batch_shape& b,
                         impala_workspace& ws) {
  const int64_t TM = b.T * b.M, N = b.U * TM;
  const int64_t width = b.D > 0 ? b.D : 1;  // action values per row
  ws.actions.resize(b.D > 0 ? 0 : static_cast<std::size_t>(N));
  ws.box_actions.resize(b.D > 0 ? static_cast<std::size_t>(N * b.D) : 0);
  ws.target_logp.resize(static_cast<std::size_t>(N));
  ws.behaviour_logp.resize(static_cast<std::size_t>(N));
  for (int64_t k = 0; k < b.U; ++k) {
    const unroll& u = batch[static_cast<std::size_t>(k)];
    if (b.D > 0) {
      const float* a = u.actions.f32();
      std::copy(a, a + TM * width, ws.box_actions.data() + k * TM * width);
    } else {
      const int32_t* a = u.actions.data<int32_t>();
      std::copy(a, a + TM, ws.actions.data() + k * TM);
    }
    log_probs(b, u.behaviour_logits.f32(), u.actions.raw(), TM, ws.behaviour_logp.data() + k * TM);
  }
  const void* all = b.D > 0 ? static_cast<const void*>(ws.box_actions.data()) : ws.actions.data();
  log_probs(b, ws.logits.data(), all, N, ws.target_logp.data());
}

// V-trace's inputs, time-major over the U * M columns, and its targets and
// advantages back in row order (ws.vs, ws.advantages).
void vtrace_targets(const std::vector<unroll>& batch, const batch_shape& b,
                    const std::vector<int64_t>& final_row, const impala_settings& s,
                    impala_workspace& ws) {
  const int64_t U = b.U, T = b.T, M = b.M;
  const int64_t TM = T * M, N = U * TM, Bc = U * M;
  const auto n = static_cast<std::size_t>(N);
  ws.log_rhos.resize(n);
  ws.rewards.resize(n);
  ws.vt_values.resize(n);
  ws.next_values.resize(n);
  ws.discounts.resize(n);
  ws.continues.resize(n);
  const float gamma = static_cast<float>(s.discount);
  const auto reward_scale = static_cast<float>(s.reward_scale);
  for (int64_t k = 0; k < U; ++k) {
    const unroll& u = batch[static_cast<std::size_t>(k)];
    const float* r = u.rewards.f32();
    const int32_t* term = u.terminated.data<int32_t>();
    const int32_t* trunc = u.truncated.data<int32_t>();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t m = 0; m < M; ++m) {
        const int64_t i = t * M + m;  // inside the unroll
        const int64_t row = k * TM + i;
        const auto e = static_cast<std::size_t>(t * Bc + k * M + m);
        const bool terminated = term[i] != 0;
        const bool truncated = trunc[i] != 0 && !terminated;
        ws.log_rhos[e] = ws.target_logp[static_cast<std::size_t>(row)] -
                         ws.behaviour_logp[static_cast<std::size_t>(row)];
        ws.rewards[e] = r[i] * reward_scale;
        ws.vt_values[e] = ws.values[static_cast<std::size_t>(row)];
        ws.discounts[e] = terminated ? 0.0f : gamma;
        float next = 0;
        if (truncated)
          next = ws.values[static_cast<std::size_t>(final_row[static_cast<std::size_t>(row)])];
        else if (!terminated)
          next = t + 1 < T ? ws.values[static_cast<std::size_t>(row + M)]
                           : ws.values[static_cast<std::size_t>(N + k * M + m)];
        ws.next_values[e] = next;
        ws.continues[e] = (t + 1 < T && !terminated && trunc[i] == 0) ? 1 : 0;
      }
    }
  }
  kernels::vtrace_input in;
  in.T = T;
  in.B = Bc;
  in.log_rhos = ws.log_rhos.data();
  in.rewards = ws.rewards.data();
  in.values = ws.vt_values.data();
  in.next_values = ws.next_values.data();
  in.discounts = ws.discounts.data();
  in.continues = ws.continues.data();
  in.rho_bar = s.rho_bar;
  in.c_bar = s.c_bar;
  in.pg_rho_bar = s.rho_bar;
  auto vt = kernels::vtrace(in);
  ws.vs.resize(n);
  ws.advantages.resize(n);
  for (int64_t k = 0; k < U; ++k)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t m = 0; m < M; ++m) {
        const auto e = static_cast<std::size_t>(t * Bc + k * M + m);
        const auto row = static_cast<std::size_t>(k * TM + t * M + m);
        ws.vs[row] = vt.vs[e];
        ws.advantages[row] = vt.pg_advantages[e];
      }
}

// Advantages to mean 0 and standard deviation 1 over this learner's batch.
void normalize(std::vector<float>& x) {
  if (x.size() < 2) return;
  double sum = 0, sq = 0;
  for (float v : x) sum += v;
  const double mean = sum / static_cast<double>(x.size());
  for (float v : x) sq += (v - mean) * (v - mean);
  const double sd = std::sqrt(sq / static_cast<double>(x.size()));
  for (float& v : x) v = static_cast<float>((v - mean) / (sd + 1e-8));
}

}  // namespace

impala_figures impala_gradients(policy_value_model& net, const std::vector<unroll>& batch,
                                const impala_settings& s, int64_t global_samples, int64_t version,
                                std::vector<named_tensor>& grads, impala_workspace& ws) {
  const auto shape = check_batch(net, batch);
  if (global_samples < 1) throw std::invalid_argument("impala: global_samples must be >= 1");
  const int64_t N = shape.U * shape.T * shape.M;  // training rows: (unroll u, step t, env m)
  const int64_t P = shape.P;
  const auto final_row = gather_rows(batch, shape, ws);
  const auto rows = static_cast<int64_t>(ws.obs.size()) / shape.O;
  ws.logits.resize(static_cast<std::size_t>(rows * P));
  ws.values.resize(static_cast<std::size_t>(rows));
  net.forward(ws.obs.data(), rows, ws.logits.data(), ws.values.data());
  action_log_probs_of(batch, shape, ws);
  vtrace_targets(batch, shape, final_row, s, ws);
  if (s.normalize_advantages) normalize(ws.advantages);

  ws.dlogits.assign(static_cast<std::size_t>(rows * P), 0.0f);
  ws.dvalues.assign(static_cast<std::size_t>(rows), 0.0f);
  const auto loss =
      shape.D > 0
          ? gaussian_loss_and_gradients(ws.logits.data(), ws.values.data(), ws.box_actions.data(),
                                        ws.vs.data(), ws.advantages.data(), N, shape.D,
                                        s.baseline_cost, s.entropy_cost, ws.dlogits.data(),
                                        ws.dvalues.data())
          : impala_loss_and_gradients(ws.logits.data(), ws.values.data(), ws.actions.data(),
                                      ws.vs.data(), ws.advantages.data(), N, P, s.baseline_cost,
                                      s.entropy_cost, ws.dlogits.data(), ws.dvalues.data());
  const float scale = 1.0f / static_cast<float>(global_samples);
  for (int64_t i = 0; i < N * P; ++i) ws.dlogits[static_cast<std::size_t>(i)] *= scale;
  for (int64_t i = 0; i < N; ++i) ws.dvalues[static_cast<std::size_t>(i)] *= scale;
  net.backward(ws.obs.data(), rows, ws.dlogits.data(), ws.dvalues.data(), grads, false);

  impala_figures f;
  f.samples = N;
  f.unrolls = shape.U;
  f.loss = loss.total;
  f.policy_loss = loss.policy;
  f.baseline_loss = loss.baseline;
  f.entropy = loss.entropy;
  for (const auto& u : batch) {
    const int64_t lag = std::max<int64_t>(0, version - u.policy_version);
    f.lag_sum += static_cast<double>(lag);
    f.lag_max = std::max(f.lag_max, lag);
  }
  return f;
}

double clip_global_norm(std::vector<named_tensor>& grads, double max_norm) {
  double sq = 0;
  for (const auto& g : grads) {
    const float* p = g.value.f32();
    for (int64_t i = 0; i < g.value.numel(); ++i) sq += static_cast<double>(p[i]) * p[i];
  }
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const auto scale = static_cast<float>(max_norm / norm);
    for (auto& g : grads) {
      float* p = g.value.f32();
      for (int64_t i = 0; i < g.value.numel(); ++i) p[i] *= scale;
    }
  }
  return norm;
}

}  // namespace troupe
