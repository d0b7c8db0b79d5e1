#pragma once
// device_policy: a policy_value_mlp's forward on a discrete device (sim:N,
// cuda:N), for the inference server of central inference on an accelerator
// (rl.central.device; SEED RL's point: every actor's observations in one
// batch on the GPU). The host policy stays the source of the weights:
// upload() copies its variables after they change, and forward() takes the
// observations from the host and gives the outputs back there (the actions
// are sampled on the host, from each actor's own stream). The layers are the
// host model's calls on the device's backend, so on sim:N the outputs are
// bit for bit the host's.
//
// Threads: construct and use it on the thread that runs the device's tasks
// (devices/device_context.hpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "config/job_config.hpp"
#include "devices/device_context.hpp"
#include "models/policy_value.hpp"

namespace troupe {

class device_policy {
 public:
  // Mirrors `variables` (a policy_value_mlp's, a Gaussian head's log_std
  // last) of model `c`; throws std::invalid_argument naming what it cannot
  // run (another model kind, a layout it does not know).
  device_policy(std::shared_ptr<device_context> ctx, const model_config& c,
                const std::vector<named_tensor>& variables);

  // The host variables, in the constructor's order and shapes, to the device.
  void upload(const std::vector<named_tensor>& variables);
  // outputs [rows, outputs()] (logits, or a Gaussian's means then log-stds)
  // and values [rows] of obs [rows, observation size], all on the host.
  void forward(const float* obs, int64_t rows, float* outputs, float* values);
  int64_t outputs() const { return gaussian_ ? 2 * actions_ : actions_; }

 private:
  void reserve(int64_t rows);

  std::shared_ptr<device_context> ctx_;
  kernels::activation act_;
  std::vector<int64_t> widths_;  // observation size, then each hidden layer
  int64_t actions_ = 0;          // logits, or a Gaussian's dimensions
  bool gaussian_ = false;
  std::vector<device_buffer> vars_;
  std::vector<float> log_std_;  // a Gaussian's, on the host
  int64_t capacity_ = 0;        // rows the activation buffers hold
  device_buffer obs_, top_, logits_, values_;
  std::vector<device_buffer> acts_;
};

}  // namespace troupe
