#pragma once
// Actor-critic networks for actor/learner RL: an MLP torso with a logits
// head (one logit per discrete action) and a value head, on the same kernels
// as the classifier. Registered by name (model.kind), like models. For a Box
// action space the policy is a Gaussian (models/gaussian_policy.hpp) over
// any registered kind: the network's "logits" are then the means, and a
// learned state-independent log-std follows them.
//
// Variables: "torso_<l>/kernel", "torso_<l>/bias" for every hidden layer,
// "policy/kernel", "policy/bias" ([hidden, actions]), "value/kernel",
// "value/bias" ([hidden, 1]); a Gaussian policy adds "policy/log_std"
// ([dims]) last.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "messages/tensor.hpp"

namespace troupe {

// The policy's distribution over actions: a softmax over discrete actions,
// or a diagonal Gaussian over a Box's dimensions.
enum class action_distribution { softmax, gaussian };

// The policy head a network ends in.
struct policy_head {
  action_distribution distribution = action_distribution::softmax;
  int64_t actions = 0;         // softmax: discrete actions; gaussian: dimensions
  double initial_log_std = 0;  // gaussian: every dimension's log-std at the start
  // The policy outputs per row: logits, or means then log-stds.
  int64_t outputs() const {
    return distribution == action_distribution::gaussian ? 2 * actions : actions;
  }
};

class policy_value_model {
 public:
  virtual ~policy_value_model() = default;
  virtual std::vector<named_tensor>& variables() = 0;
  virtual action_distribution distribution() const { return action_distribution::softmax; }
  // The observation size the network takes: by default the rows of its first
  // kernel (a dense layer's [inputs, units]); a conv torso says its own.
  virtual int64_t input_size() {
    auto& v = variables();
    return v.empty() || v.front().value.rank() != 2 ? -1 : v.front().value.dim(0);
  }
  // logits [B, actions] (a Gaussian's outputs [B, 2 dims]: the means, then
  // the log-stds) and values [B] of observations obs [B, observation
  // size]. Keeps what backward() needs.
  virtual void forward(const float* obs, int64_t batch, float* logits, float* values) = 0;
  // After forward() on the same observations: the gradients of
  // sum_b (dlogits[b] . logits[b] + dvalues[b] values[b]) into grads (from
  // make_gradients()); added to them with accumulate.
  virtual void backward(const float* obs, int64_t batch, const float* dlogits, const float* dvalues,
                        std::vector<named_tensor>& grads, bool accumulate = false) = 0;
  std::vector<named_tensor> make_gradients();
};

// The policy and value heads over a torso of `hidden` features, appended to
// vars: "policy/kernel" [hidden, actions], "policy/bias", "value/kernel"
// [hidden, 1], "value/bias". Small Glorot kernels, so that the first policy
// is near uniform and the first values near 0; biases zero. Shared by every
// policy/value model.
void add_policy_value_heads(std::vector<named_tensor>& vars, int64_t hidden, int64_t actions,
                            uint64_t seed);

using policy_value_factory = std::function<std::unique_ptr<policy_value_model>(
    const model_config&, int64_t observation_size, int64_t actions, uint64_t seed)>;

// Registers a factory; throws std::invalid_argument if the name is taken.
// Built in: "policy_value_mlp" (model.hidden, model.activation, model.init).
void register_policy_value_model(const std::string& kind, policy_value_factory f);
// The torso as a layer stack (model.layers, models/layer_model.hpp's
// layers) over the observation, ending in a [features] vector; the heads as
// policy_value_mlp's. Registered as "policy_value_layers".
std::unique_ptr<policy_value_model> make_policy_value_layers(const model_config& c,
                                                             int64_t observation_size,
                                                             int64_t actions, uint64_t seed);
// Throws std::invalid_argument naming the registered kinds for an unknown one.
std::unique_ptr<policy_value_model> create_policy_value_model(const model_config& c,
                                                              int64_t observation_size,
                                                              int64_t actions, uint64_t seed);
// The network of model.kind ending in `head`: a softmax's logits as above, or
// a Gaussian's means (the kind built with head.actions outputs) and log-std.
std::unique_ptr<policy_value_model> create_policy_value_model(const model_config& c,
                                                              int64_t observation_size,
                                                              const policy_head& head,
                                                              uint64_t seed);

// IMPALA's loss over N = T * B steps, as sums over the steps:
//   policy gradient  -sum_t pg_advantage_t log pi(a_t | x_t)
//   baseline         baseline_cost * 0.5 * sum_t (vs_t - V(x_t))^2
//   entropy          -entropy_cost * sum_t H(pi(. | x_t))
// Writes dlogits [N, actions] and dvalues [N] (the loss's gradients with
// respect to the network's outputs; pg_advantage and vs are constants) and
// returns the three terms and their total. Actions outside [0, actions)
// throw std::out_of_range.
struct impala_loss {
  double policy = 0, baseline = 0, entropy = 0;  // entropy: sum of H, before the cost
  double total = 0;
};
// The baseline's term of one step, baseline_cost * 0.5 * (value - target)^2,
// with its gradient with respect to the value in dvalue.
double baseline_loss_and_gradient(double value, double target, double baseline_cost, float& dvalue);
impala_loss impala_loss_and_gradients(const float* logits, const float* values,
                                      const int32_t* actions, const float* vs,
                                      const float* pg_advantages, int64_t n, int64_t num_actions,
                                      double baseline_cost, double entropy_cost, float* dlogits,
                                      float* dvalues);

// log pi(a | x) for each step's action (behaviour or target policy).
void action_log_probs(const float* logits, const int32_t* actions, int64_t n, int64_t num_actions,
                      float* out);

}  // namespace troupe
