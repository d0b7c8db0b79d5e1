#pragma once
// Learning-rate schedules (optimizer_config::schedule).
#include <cstdint>

#include "config/job_config.hpp"

namespace troupe::kernels {

// The learning rate for the update that follows `step` updates already done
// (0-based). total_steps is the length of the whole run (cosine's default
// horizon). Kinds:
//   constant: lr
//   step:     lr * gamma^floor(s / step_size)
//   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * min(s, D) / D)) / 2,
//             D = decay_steps, or total_steps when decay_steps is 0
//             (D <= 0: no decay); stays at min_lr after D.
// With warmup_steps > 0: lr * (step + 1) / warmup_steps while
// step < warmup_steps, then the schedule runs on s = step - warmup_steps
// (without warm-up s = step).
// Throws std::invalid_argument for an unknown kind or step_size <= 0 (step).
double learning_rate_at(const troupe::optimizer_config& c, int64_t step, int64_t total_steps);

}  // namespace troupe::kernels
