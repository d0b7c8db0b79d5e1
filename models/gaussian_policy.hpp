#pragma once
// The Gaussian policy head for Box action spaces: a diagonal Gaussian per
// observation, its means the network's policy outputs (one per action
// dimension) and its log-std a learned, state-independent variable
// "policy/log_std" [dims]. Actions are sampled from it unclipped (the
// environment clips them to its bounds), and their log-probabilities are of
// the unclipped sample, as is standard for V-trace and policy gradients.
//
// Outputs of a row: the dims means, then the dims log-stds.
#include <cstdint>
#include <memory>

#include "models/policy_value.hpp"

namespace troupe {

// A Gaussian policy over `means` (a policy/value network built with `dims`
// policy outputs): variables are the network's, then "policy/log_std"
// initialised to initial_log_std.
std::unique_ptr<policy_value_model> make_gaussian_policy(std::unique_ptr<policy_value_model> means,
                                                         int64_t dims, double initial_log_std);

// log pi(a | x) of each row's action a [n, dims] under outputs [n, 2 dims].
void gaussian_log_probs(const float* outputs, const float* actions, int64_t n, int64_t dims,
                        float* out);

// IMPALA's loss for the Gaussian head (as impala_loss_and_gradients, with
// H = sum_d (log sigma_d + 0.5 log(2 pi e))); doutputs [n, 2 dims].
impala_loss gaussian_loss_and_gradients(const float* outputs, const float* values,
                                        const float* actions, const float* vs,
                                        const float* pg_advantages, int64_t n, int64_t dims,
                                        double baseline_cost, double entropy_cost, float* doutputs,
                                        float* dvalues);

}  // namespace troupe
