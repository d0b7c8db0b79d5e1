// MountainCar-v0 and MountainCarContinuous-v0 with Gymnasium's dynamics: a
// car in a valley, x in [-1.2, 0.6], velocity bounded to 0.07, gravity
// -0.0025 cos(3 x); velocity clipped first, then the position, and a car
// stopped against the left wall (velocity set to 0 there when negative);
// start position uniform in [-0.6, -0.4), velocity 0; observation (x,
// velocity).
//
// MountainCar-v0: push left (0), none (1) or right (2) with 0.001; double
// precision; -1 per step, the terminating one included; terminated at x >=
// 0.5 with velocity >= 0; truncated at 200 steps.
//
// MountainCarContinuous-v0: force in [-1, 1] (a Box of one float32, clipped
// by the environment) times power 0.0015; its state is float32 after a step
// and NumPy 2 then computes in float32 (Python floats are cast to float32
// when they meet it), as written below; reward 100 on reaching x >= 0.45
// with velocity >= 0, minus 0.1 u^2 of the unclipped action every step;
// truncated at 999 steps.
#include <algorithm>
#include <cmath>

#include "envs/batch_env.hpp"
#include "envs/builtin.hpp"

namespace troupe::envs {
namespace {

// What both variants share.
struct mountain_car_base {
  static constexpr int state_size = 2;  // position, velocity
  static constexpr double min_position = -1.2;
  static constexpr double max_position = 0.6;
  static constexpr double max_speed = 0.07;

  static void reset(splitmix64& rng, double* s) {
    s[0] = uniform(rng, -0.6, -0.4);
    s[1] = 0;
  }
};

struct mountain_car : mountain_car_base {
  static constexpr double force = 0.001;
  static constexpr double gravity = 0.0025;
  static constexpr double goal_position = 0.5;

  static env_spec spec() { return {"MountainCar-v0", 2, 3, 200, {}, {}, {}, "float32"}; }

  static bool step(double* s, int32_t action, double& reward) {
    double position = s[0], velocity = s[1];
    velocity += (action - 1) * force + std::cos(3 * position) * (-gravity);
    velocity = std::clamp(velocity, -max_speed, max_speed);
    position += velocity;
    position = std::clamp(position, min_position, max_position);
    if (position == min_position && velocity < 0) velocity = 0;
    s[0] = position;
    s[1] = velocity;
    reward = -1.0;
    return position >= goal_position && velocity >= 0;
  }

  static void observe(const double* s, float* obs) {
    obs[0] = static_cast<float>(s[0]);
    obs[1] = static_cast<float>(s[1]);
  }
};

// Gymnasium's state is float64 right after a reset (an np.array of a Python
// float) and float32 after every step (np.float32 array); NumPy then
// computes in the state's precision, and so does this: a state whose
// components are float32 values steps in float32.
struct mountain_car_continuous : mountain_car_base {
  static constexpr int action_dims = 1;
  static constexpr float min_action = -1.0f;
  static constexpr float max_action = 1.0f;
  static constexpr float power = 0.0015f;
  static constexpr double goal_position = 0.45;

  static env_spec spec() {
    return {"MountainCarContinuous-v0", 2, 0, 999, {min_action}, {max_action}, {}, "float32"};
  }

  // The velocity's change: float32 for an action inside the bounds (an
  // np.float32 force); a clipped one is a Python float, so the change is a
  // double (cast to float32 when it meets a float32 velocity).
  template <class T>
  static double acceleration(float a, T position) {
    const double hill = 0.0025 * std::cos(static_cast<double>(static_cast<T>(3) * position));
    if (a >= min_action && a <= max_action) return a * power - static_cast<float>(hill);
    return (a > max_action ? 1.0 : -1.0) * 0.0015 - hill;
  }

  // One step in the precision T of the state; true: the goal is reached.
  template <class T>
  static bool move(T& position, T& velocity, float a) {
    velocity += static_cast<T>(acceleration(a, position));
    velocity = std::clamp(velocity, static_cast<T>(-max_speed), static_cast<T>(max_speed));
    position += velocity;
    position = std::clamp(position, static_cast<T>(min_position), static_cast<T>(max_position));
    if (position == static_cast<T>(min_position) && velocity < 0) velocity = 0;
    return position >= static_cast<T>(goal_position) && velocity >= 0;
  }

  static bool step(double* s, const float* action, double& reward) {
    bool terminated = false;
    if (s[0] == static_cast<float>(s[0]) && s[1] == static_cast<float>(s[1])) {
      auto position = static_cast<float>(s[0]), velocity = static_cast<float>(s[1]);
      terminated = move(position, velocity, action[0]);
      s[0] = position;
      s[1] = velocity;
    } else {
      terminated = move(s[0], s[1], action[0]);
    }
    s[0] = static_cast<float>(s[0]);  // Gymnasium stores the state as float32
    s[1] = static_cast<float>(s[1]);
    reward = (terminated ? 100.0 : 0.0) - std::pow(static_cast<double>(action[0]), 2) * 0.1;
    return terminated;
  }

  static void observe(const double* s, float* obs) {
    obs[0] = static_cast<float>(s[0]);
    obs[1] = static_cast<float>(s[1]);
  }
};

}  // namespace

std::unique_ptr<vector_env> make_mountain_car(int64_t instances) {
  return std::make_unique<batch_env<mountain_car>>(instances);
}

std::unique_ptr<vector_env> make_mountain_car_continuous(int64_t instances) {
  return std::make_unique<batch_env<mountain_car_continuous>>(instances);
}

}  // namespace troupe::envs
