#include "kernels/vtrace.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace troupe::kernels {

vtrace_output vtrace(const vtrace_input& in) {
  if (in.T < 0 || in.B < 0) throw std::invalid_argument("vtrace: negative T or B");
  if (!(in.rho_bar > 0) || !(in.c_bar > 0) || !(in.pg_rho_bar > 0))
    throw std::invalid_argument("vtrace: clip thresholds must be > 0");
  const auto n = static_cast<std::size_t>(in.T * in.B);
  if (n > 0 && (!in.log_rhos || !in.rewards || !in.values || !in.next_values || !in.discounts ||
                !in.continues))
    throw std::invalid_argument("vtrace: an input is missing");
  vtrace_output out;
  out.vs.assign(n, 0.0f);
  out.pg_advantages.assign(n, 0.0f);
  // Per trajectory, backwards in time; sums in double.
  for (int64_t b = 0; b < in.B; ++b) {
    double acc = 0;  // vs_{t+1} - V(x_{t+1}) within the episode
    for (int64_t t = in.T - 1; t >= 0; --t) {
      const auto i = static_cast<std::size_t>(t * in.B + b);
      const double rho = std::exp(static_cast<double>(in.log_rhos[i]));
      const double clipped_rho = std::min(in.rho_bar, rho);
      const double c = std::min(in.c_bar, rho);
      const double v = in.values[i];
      const double next_v = in.next_values[i];
      const double gamma = in.discounts[i];
      const double r = in.rewards[i];
      const double carry = in.continues[i] ? acc : 0.0;
      const double delta = clipped_rho * (r + gamma * next_v - v);
      acc = delta + gamma * c * carry;
      out.vs[i] = static_cast<float>(v + acc);
      // vs_{t+1}: the next step's target in the same episode, else the value
      // after the episode's last step (0 weight when it terminated).
      const double vs_next = next_v + carry;
      out.pg_advantages[i] =
          static_cast<float>(std::min(in.pg_rho_bar, rho) * (r + gamma * vs_next - v));
    }
  }
  return out;
}

}  // namespace troupe::kernels
