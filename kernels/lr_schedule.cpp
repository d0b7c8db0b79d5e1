#include "kernels/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace troupe::kernels {

double learning_rate_at(const troupe::optimizer_config& c, int64_t step, int64_t total_steps) {
  const schedule_config& s = c.schedule;
  const double lr = c.learning_rate;
  const bool is_constant = s.kind == "constant";
  const bool is_step = s.kind == "step";
  const bool is_cosine = s.kind == "cosine";
  if (!is_constant && !is_step && !is_cosine)
    throw std::invalid_argument("learning_rate_at: unknown schedule kind '" + s.kind +
                                "' (expected constant, step or cosine)");
  if (is_step && s.step_size <= 0)
    throw std::invalid_argument("learning_rate_at: step schedule needs step_size >= 1, got " +
                                std::to_string(s.step_size));
  if (step < 0) step = 0;

  if (s.warmup_steps > 0 && step < s.warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  const int64_t t = s.warmup_steps > 0 ? step - s.warmup_steps : step;

  if (is_constant) return lr;
  if (is_step) return lr * std::pow(s.gamma, static_cast<double>(t / s.step_size));
  // cosine
  const int64_t horizon = s.decay_steps > 0 ? s.decay_steps : total_steps;
  if (horizon <= 0) return lr;
  const double frac = static_cast<double>(std::min(t, horizon)) / static_cast<double>(horizon);
  return s.min_lr + (lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * frac));
}

}  // namespace troupe::kernels
