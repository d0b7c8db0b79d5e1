// Acrobot-v1 with Gymnasium's dynamics ("book" variant): two links, torque
// -1, 0 or +1 on the joint between them; fourth-order Runge-Kutta over
// dt = 0.2 s in double precision; angles wrapped to [-pi, pi], velocities
// bounded to 4 pi and 9 pi; -1 per step, 0 on the terminating one;
// terminated when the free end rises above one link's length over the pivot
// (-cos(theta1) - cos(theta1 + theta2) > 1); truncated at 500 steps; start
// state uniform in [-0.1, 0.1) per component; observation (cos theta1,
// sin theta1, cos theta2, sin theta2, dtheta1, dtheta2).
#include <algorithm>
#include <cmath>

#include "envs/batch_env.hpp"
#include "envs/builtin.hpp"

namespace troupe::envs {
namespace {

struct acrobot {
  static constexpr int state_size = 4;  // theta1, theta2, dtheta1, dtheta2
  static constexpr double dt = 0.2;
  static constexpr double m1 = 1.0, m2 = 1.0;    // link masses
  static constexpr double l1 = 1.0;              // link 1 length
  static constexpr double lc1 = 0.5, lc2 = 0.5;  // centres of mass
  static constexpr double I1 = 1.0, I2 = 1.0;    // moments of inertia
  static constexpr double g = 9.8;
  static constexpr double max_vel_1 = 4 * M_PI;
  static constexpr double max_vel_2 = 9 * M_PI;

  static env_spec spec() { return {"Acrobot-v1", 6, 3, 500, {}, {}, {}, "float32"}; }

  static void reset(splitmix64& rng, double* s) {
    for (int c = 0; c < state_size; ++c) s[c] = uniform(rng, -0.1, 0.1);
  }

  // The derivative of (theta1, theta2, dtheta1, dtheta2) under torque a.
  static void dsdt(const double* s, double a, double* d) {
    const double theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
    const double d1 =
        m1 * (lc1 * lc1) + m2 * (l1 * l1 + lc2 * lc2 + 2 * l1 * lc2 * std::cos(theta2)) + I1 + I2;
    const double d2 = m2 * (lc2 * lc2 + l1 * lc2 * std::cos(theta2)) + I2;
    const double phi2 = m2 * lc2 * g * std::cos(theta1 + theta2 - M_PI / 2.0);
    const double phi1 = -m2 * l1 * lc2 * (dtheta2 * dtheta2) * std::sin(theta2) -
                        2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                        (m1 * lc1 + m2 * l1) * g * std::cos(theta1 - M_PI / 2) + phi2;
    const double ddtheta2 =
        (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * std::sin(theta2) - phi2) /
        (m2 * (lc2 * lc2) + I2 - (d2 * d2) / d1);
    const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    d[0] = dtheta1;
    d[1] = dtheta2;
    d[2] = ddtheta1;
    d[3] = ddtheta2;
  }

  static double wrap(double x, double m, double M) {
    const double diff = M - m;
    while (x > M) x = x - diff;
    while (x < m) x = x + diff;
    return x;
  }

  static bool step(double* s, int32_t action, double& reward) {
    static constexpr double torque[3] = {-1.0, 0.0, 1.0};
    const double a = torque[action];
    // rk4 over [0, dt], evaluated in Gymnasium's order.
    constexpr double dt2 = dt / 2.0;
    double k1[4], k2[4], k3[4], k4[4], y[4];
    dsdt(s, a, k1);
    for (int c = 0; c < 4; ++c) y[c] = s[c] + dt2 * k1[c];
    dsdt(y, a, k2);
    for (int c = 0; c < 4; ++c) y[c] = s[c] + dt2 * k2[c];
    dsdt(y, a, k3);
    for (int c = 0; c < 4; ++c) y[c] = s[c] + dt * k3[c];
    dsdt(y, a, k4);
    for (int c = 0; c < 4; ++c) s[c] = s[c] + dt / 6.0 * (k1[c] + 2 * k2[c] + 2 * k3[c] + k4[c]);
    s[0] = wrap(s[0], -M_PI, M_PI);
    s[1] = wrap(s[1], -M_PI, M_PI);
    s[2] = std::clamp(s[2], -max_vel_1, max_vel_1);
    s[3] = std::clamp(s[3], -max_vel_2, max_vel_2);
    const bool terminated = -std::cos(s[0]) - std::cos(s[1] + s[0]) > 1.0;
    reward = terminated ? 0.0 : -1.0;
    return terminated;
  }

  static void observe(const double* s, float* obs) {
    obs[0] = static_cast<float>(std::cos(s[0]));
    obs[1] = static_cast<float>(std::sin(s[0]));
    obs[2] = static_cast<float>(std::cos(s[1]));
    obs[3] = static_cast<float>(std::sin(s[1]));
    obs[4] = static_cast<float>(s[2]);
    obs[5] = static_cast<float>(s[3]);
  }
};

}  // namespace

std::unique_ptr<vector_env> make_acrobot(int64_t instances) {
  return std::make_unique<batch_env<acrobot>>(instances);
}

}  // namespace troupe::envs
