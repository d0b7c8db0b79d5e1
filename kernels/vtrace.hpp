#pragma once
// V-trace (Espeholt et al. 2018, IMPALA): off-policy corrected value targets
// and policy-gradient advantages for unrolls of T steps over B trajectories,
// time-major ([T, B], element t * B + b).
//
// Episode ends inside an unroll are explicit, because an actor resets an
// environment on the step its episode ends (envs/env.hpp):
//   discounts[t]    gamma, or 0 when step t terminated the episode (no value
//                   after it);
//   next_values[t]  the value of the state after step t in the same episode:
//                   values[t + 1] while the episode goes on, the value of the
//                   final observation when the time limit truncated it, the
//                   bootstrap value after the unroll's last step;
//   continues[t]    1 when step t + 1 of the unroll continues step t's
//                   episode (t < T - 1 and the episode neither terminated nor
//                   was truncated at t), else 0: the trace is cut there.
// With no episode end inside the unroll this is the paper's recursion:
//   delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),
//   vs_t    = V(x_t) + delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1})),
//   adv_t   = rho^pg_t (r_t + gamma_t vs_{t+1} - V(x_t)),
// with rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu),
// rho^pg_t = min(pg_rho_bar, pi/mu), and vs_T the bootstrap value.
#include <cstdint>
#include <vector>

namespace troupe::kernels {

struct vtrace_input {
  int64_t T = 0, B = 0;
  const float* log_rhos = nullptr;  // log pi(a_t|x_t) - log mu(a_t|x_t)
  const float* rewards = nullptr;
  const float* values = nullptr;       // V(x_t) under the learner's parameters
  const float* next_values = nullptr;  // see above
  const float* discounts = nullptr;
  const uint8_t* continues = nullptr;
  double rho_bar = 1.0;     // clip of the importance weights in the targets
  double c_bar = 1.0;       // clip of the trace coefficients
  double pg_rho_bar = 1.0;  // clip in the policy-gradient advantages
};

struct vtrace_output {
  std::vector<float> vs;             // value targets [T, B]
  std::vector<float> pg_advantages;  // [T, B]
};

// Throws std::invalid_argument for negative sizes, missing inputs or
// clip thresholds that are not positive.
vtrace_output vtrace(const vtrace_input& in);

}  // namespace troupe::kernels
