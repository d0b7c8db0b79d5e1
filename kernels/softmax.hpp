#pragma once
// The softmax of one row of logits, max-subtracted, for the RL paths that
// work row by row: the actor samples an action from it (actors/rl_actor.cpp,
// in float) and the IMPALA loss takes its log-probabilities (models/
// policy_value.cpp, in double). The precision is the caller's, so each path
// keeps the exact values it has always computed. Compiled into its callers:
// not for the per-ISA loop files (kernels/elementwise.hpp says why).
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace troupe::kernels {

template <class T>
struct exp_row_sums {
  T max;       // the row's largest logit
  double sum;  // sum_j exp(z_j - max), accumulated in double
};

// e_j = exp(z_j - max_k z_k) in T for the n logits of one row; the softmax is
// e / sum, and max + log(sum) the row's log-sum-exp.
template <class T>
exp_row_sums<T> shifted_exp_row(const float* z, int64_t n, T* e) {
  T max = static_cast<T>(z[0]);
  for (int64_t j = 1; j < n; ++j) max = std::max(max, static_cast<T>(z[j]));
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    e[j] = std::exp(static_cast<T>(z[j]) - max);
    sum += e[j];
  }
  return {max, sum};
}

}  // namespace troupe::kernels
