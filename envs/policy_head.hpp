#pragma once
// Which policy head an environment's action space takes: a softmax over
// discrete actions, a Gaussian over a Box's dimensions.
#include <string>

#include "envs/env.hpp"
#include "models/policy_value.hpp"

namespace troupe::envs {

// The head for `spec`: choice "auto" picks the one its action space takes;
// "softmax" or "gaussian" must fit it. Throws std::invalid_argument naming the
// environment, its action space and the head when they do not fit, or for
// another choice.
policy_head policy_head_for(const env_spec& spec, const std::string& choice,
                            double initial_log_std = 0);

}  // namespace troupe::envs
