#pragma once
// The built-in environments' factories (envs/env.cpp registers them).
#include <memory>

#include "envs/env.hpp"

namespace troupe::envs {

std::unique_ptr<vector_env> make_cartpole(int64_t instances);
std::unique_ptr<vector_env> make_acrobot(int64_t instances);
std::unique_ptr<vector_env> make_mountain_car(int64_t instances);
std::unique_ptr<vector_env> make_mountain_car_continuous(int64_t instances);
std::unique_ptr<vector_env> make_pendulum(int64_t instances);

}  // namespace troupe::envs
