#pragma once
// A policy_value_mlp computing on a discrete device (sim:N, cuda:N): the
// learner's forward and backward (actor_learner on a device in `devices`)
// and the inference server's batches (rl.central.device). The variables,
// their gradients and the optimizer stay on the host, where V-trace, the
// loss and the optimizer step read them (small for the RL policies); each
// forward uploads the variables and the observations and brings the
// outputs back, and backward takes the outputs' gradients up and brings the
// variables' gradients back. The layers are the host model's calls, in its
// order, on the device's backend, so on sim:N every output and gradient is
// bit for bit the host's.
//
// Threads: make and use it on the thread that runs the device's tasks
// (devices/device_context.hpp).
#include <cstdint>
#include <memory>

#include "config/job_config.hpp"
#include "devices/device_context.hpp"
#include "models/policy_value.hpp"

namespace troupe {

// The policy of `c` (a Gaussian head's log-std on the host, around the
// device's means) computing on `ctx`'s device; on the host (ctx null or
// cpu:N) the model create_policy_value_model makes. Throws
// std::invalid_argument naming what a device cannot run (another model
// kind).
std::unique_ptr<policy_value_model> create_policy_value_model_on(
    const std::shared_ptr<device_context>& ctx, const model_config& c, int64_t observation_size,
    const policy_head& head, uint64_t seed);

}  // namespace troupe
