#pragma once
// One IMPALA learner update's math (Espeholt et al. 2018), on a batch of
// unrolls: the policy/value network's forward over every observation, V-trace
// targets (kernels/vtrace.hpp), the loss's gradients
// (impala_loss_and_gradients) and the backward pass. The learner actor runs it
// on its device thread; tests run it directly.
#include <cstdint>
#include <vector>

#include "messages/rl_messages.hpp"
#include "models/policy_value.hpp"

namespace troupe {

struct impala_settings {
  double discount = 0.99;
  double reward_scale = 1.0;  // rewards are multiplied by it
  double rho_bar = 1.0;
  double c_bar = 1.0;
  double baseline_cost = 0.5;
  double entropy_cost = 0.01;
  // V-trace's policy-gradient advantages to mean 0 and standard deviation 1
  // over the learner's batch before the loss.
  bool normalize_advantages = false;
};

// Sums over the batch's steps (divide by `samples` for means).
struct impala_figures {
  int64_t samples = 0;  // T * M * unrolls
  double loss = 0, policy_loss = 0, baseline_loss = 0, entropy = 0;
  double lag_sum = 0;  // over unrolls: version - policy_version
  int64_t lag_max = 0;
  int64_t unrolls = 0;
};

// Buffers reused between updates.
struct impala_workspace {
  std::vector<float> obs, logits, values, dlogits, dvalues;
  std::vector<float> log_rhos, rewards, vt_values, next_values, discounts;
  std::vector<uint8_t> continues;
  std::vector<float> vs, advantages, target_logp, behaviour_logp;
  std::vector<int32_t> actions;
  std::vector<float> box_actions;  // [N, dims] for a Gaussian policy
};

// The gradients of IMPALA's loss over `batch` (this learner's share),
// divided by `global_samples` (the steps in the whole batch, over all
// learners: the loss is a mean over it), written into grads (from
// net.make_gradients()). `version` is the learner's, for the policy lag.
// Throws std::invalid_argument naming the unroll for an unroll whose shapes
// do not fit the network or the batch's first unroll.
impala_figures impala_gradients(policy_value_model& net, const std::vector<unroll>& batch,
                                const impala_settings& s, int64_t global_samples, int64_t version,
                                std::vector<named_tensor>& grads, impala_workspace& ws);

// The global L2 norm of the gradients; when it exceeds max_norm > 0 they
// are scaled down to it. Returns the norm before clipping.
double clip_global_norm(std::vector<named_tensor>& grads, double max_norm);

}  // namespace troupe
