// CartPole-v1 with Gymnasium's dynamics: a pole on a cart, pushed left (0) or
// right (1) with 10 N; Euler integration at tau = 0.02 s in double
// precision; +1 per step, the terminating step included; terminated when
// |x| > 2.4 or |theta| > 12 degrees; truncated at 500 steps; start state
// uniform in [-0.05, 0.05) per component.
#include <cmath>

#include "envs/batch_env.hpp"
#include "envs/builtin.hpp"

namespace troupe::envs {
namespace {

struct cartpole {
  static constexpr int state_size = 4;  // x, x_dot, theta, theta_dot
  static constexpr double gravity = 9.8;
  static constexpr double masscart = 1.0;
  static constexpr double masspole = 0.1;
  static constexpr double total_mass = masspole + masscart;
  static constexpr double length = 0.5;  // half the pole's length
  static constexpr double polemass_length = masspole * length;
  static constexpr double force_mag = 10.0;
  static constexpr double tau = 0.02;
  static constexpr double x_threshold = 2.4;
  static double theta_threshold() { return 12 * 2 * M_PI / 360; }

  static env_spec spec() { return {"CartPole-v1", 4, 2, 500, {}, {}, {}, "float32"}; }

  static void reset(splitmix64& rng, double* s) {
    for (int c = 0; c < state_size; ++c) s[c] = uniform(rng, -0.05, 0.05);
  }

  // Written as Gymnasium writes it, so that the doubles round the same way.
  static bool step(double* s, int32_t action, double& reward) {
    double x = s[0], x_dot = s[1], theta = s[2], theta_dot = s[3];
    const double force = action == 1 ? force_mag : -force_mag;
    const double costheta = std::cos(theta);
    const double sintheta = std::sin(theta);
    const double temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass;
    const double thetaacc = (gravity * sintheta - costheta * temp) /
                            (length * (4.0 / 3.0 - masspole * (costheta * costheta) / total_mass));
    const double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    x = x + tau * x_dot;
    x_dot = x_dot + tau * xacc;
    theta = theta + tau * theta_dot;
    theta_dot = theta_dot + tau * thetaacc;
    s[0] = x;
    s[1] = x_dot;
    s[2] = theta;
    s[3] = theta_dot;
    reward = 1.0;
    return x < -x_threshold || x > x_threshold || theta < -theta_threshold() ||
           theta > theta_threshold();
  }

  static void observe(const double* s, float* obs) {
    for (int c = 0; c < state_size; ++c) obs[c] = static_cast<float>(s[c]);
  }
};

}  // namespace

std::unique_ptr<vector_env> make_cartpole(int64_t instances) {
  return std::make_unique<batch_env<cartpole>>(instances);
}

}  // namespace troupe::envs
