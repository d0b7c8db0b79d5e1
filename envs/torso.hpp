#pragma once
// The torso of the actor/learner's policy/value network, as rl.torso picks
// it for the job's environment: an MLP over the flattened observation
// (model.kind as given), or a conv stack over image observations.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/job_config.hpp"
#include "envs/env.hpp"

namespace troupe::envs {

// The conv torso of the Nature DQN (Mnih et al. 2015), also IMPALA's
// "shallow" network: conv 32 8x8 stride 4, conv 64 4x4 stride 2, conv 64
// 3x3 stride 1 (each ReLU), flatten, dense 512 ReLU; as model.layers over a
// flat observation (a reshape to [C, H, W] first; [H, W] gets C = 1).
// Throws config_error at rl.torso naming the environment, its observation
// space and the first conv layer when the shape is not an image of at least
// 36x36 (where the third conv's window still fits).
nlohmann::json nature_cnn_layers(const env_spec& spec);

// The model the actors, learners and inference server build for `spec`:
// "mlp" keeps `model`; "nature_cnn" is kind policy_value_layers with the
// layers above; "auto" picks nature_cnn for an image observation ([C, H, W]
// or [H, W]) when model.kind is policy_value_mlp (the default network), and
// keeps `model` otherwise (a model.layers of one's own stays as written).
model_config rl_model_for(const env_spec& spec, const model_config& model,
                          const std::string& torso);

// Whether the observation is an image (two or three dimensions).
bool image_observation(const env_spec& spec);

}  // namespace troupe::envs
