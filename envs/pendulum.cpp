// Pendulum-v1 with Gymnasium's dynamics: a pendulum swung up by a torque u
// in [-2, 2] (a Box of one float32, clipped by the environment); theta and
// theta_dot in double precision, explicit Euler at dt = 0.05 s, theta_dot
// bounded to 8; reward -(theta^2 + 0.1 theta_dot^2 + 0.001 u^2) with theta
// normalised to [-pi, pi) (computed before the step, u's term in float32 as
// NumPy computes a float32 action's); never terminates, truncated at 200
// steps; start state uniform in [-pi, pi) x [-1, 1); observation (cos theta,
// sin theta, theta_dot).
#include <algorithm>
#include <cmath>

#include "envs/batch_env.hpp"
#include "envs/builtin.hpp"

namespace troupe::envs {
namespace {

struct pendulum {
  static constexpr int state_size = 2;  // theta, theta_dot
  static constexpr int action_dims = 1;
  static constexpr double max_speed = 8;
  static constexpr float max_torque = 2.0f;
  static constexpr double dt = 0.05;
  static constexpr double g = 10.0;
  static constexpr double m = 1.0;
  static constexpr double l = 1.0;

  static env_spec spec() {
    return {"Pendulum-v1", 3, 0, 200, {-max_torque}, {max_torque}, {}, "float32"};
  }

  static void reset(splitmix64& rng, double* s) {
    s[0] = uniform(rng, -M_PI, M_PI);
    s[1] = uniform(rng, -1.0, 1.0);
  }

  // NumPy's ((x + pi) % (2 pi)) - pi: the remainder takes the divisor's sign.
  static double angle_normalize(double x) {
    double r = std::fmod(x + M_PI, 2 * M_PI);
    if (r != 0 && r < 0) r += 2 * M_PI;
    return r - M_PI;
  }

  // Written as Gymnasium writes it: u stays float32 (NumPy 2 keeps a float32
  // scalar float32 against Python floats), the state double.
  static bool step(double* s, const float* action, double& reward) {
    const double th = s[0], thdot = s[1];
    const float u = std::clamp(action[0], -max_torque, max_torque);
    const double th_n = angle_normalize(th);
    const float torque_cost = 0.001f * (u * u);
    const double costs = th_n * th_n + 0.1 * (thdot * thdot) + static_cast<double>(torque_cost);
    const float torque_acc = static_cast<float>(3.0 / (m * l * l)) * u;
    double newthdot =
        thdot + (3 * g / (2 * l) * std::sin(th) + static_cast<double>(torque_acc)) * dt;
    newthdot = std::clamp(newthdot, -max_speed, max_speed);
    s[0] = th + newthdot * dt;
    s[1] = newthdot;
    reward = -costs;
    return false;
  }

  static void observe(const double* s, float* obs) {
    obs[0] = static_cast<float>(std::cos(s[0]));
    obs[1] = static_cast<float>(std::sin(s[0]));
    obs[2] = static_cast<float>(s[1]);
  }
};

}  // namespace

std::unique_ptr<vector_env> make_pendulum(int64_t instances) {
  return std::make_unique<batch_env<pendulum>>(instances);
}

}  // namespace troupe::envs
