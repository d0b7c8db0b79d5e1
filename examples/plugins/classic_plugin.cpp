// A native environment plugin in one file (docs/environments.md): CartPole-v1
// with the dynamics of troupe's built-in one (and Gymnasium's), and
// Corridor-v0, a corridor whose optimal return is known: start in cell 0,
// step left (0) or right (1), -0.1 a step and +1 on reaching the last cell
// (length 5: four steps right, 0.7). Built by examples/plugins/CMakeLists.txt
// with one add_library; used by examples/cartpole_plugin.json.
//
// troupe sees only the C table at the end (envs/troupe_env_plugin.h); the
// C++ inside is this file's own business, so no exception may leave it.
#include "troupe_env_plugin.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

// The header leaves troupe_env opaque: each plugin defines it as it likes.
struct troupe_env {
  virtual ~troupe_env() = default;
  virtual troupe_env_info info() const = 0;
  virtual void reset(uint64_t seed, float* obs) = 0;
  virtual void step(const int32_t* actions, const troupe_env_step_out& out) = 0;
  std::string error;  // last_error's text
};

namespace {

// troupe's seeded streams (models/random.hpp), so that instance i of a
// batch reset with seed s starts exactly as troupe's built-in CartPole does.
struct splitmix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

uint64_t stream_seed(uint64_t seed, uint64_t instance) {
  splitmix64 g{seed ^ (0xD1B54A32D192ED03ULL * (instance + 1))};
  return g.next();
}

// Gymnasium's CartPole-v1: Euler steps of 0.02 s, +1 a step, terminated past
// |x| > 2.4 or |theta| > 12 degrees, truncated at max_episode_steps.
struct cartpole final : troupe_env {
  int64_t n, max_steps;
  std::vector<std::array<double, 4>> s;  // x, x_dot, theta, theta_dot
  std::vector<splitmix64> rng;
  std::vector<int64_t> steps;

  cartpole(int64_t instances, int64_t max_episode_steps)
      : n(instances), max_steps(max_episode_steps), s(n), rng(n, splitmix64{0}), steps(n, 0) {}

  troupe_env_info info() const override {
    return {"CartPole-v1",
            TROUPE_DTYPE_FLOAT32,
            4,
            TROUPE_SPACE_DISCRETE,
            2,
            nullptr,
            nullptr,
            max_steps,
            4};
  }
  void start(int64_t i) {
    for (auto& c : s[i]) c = -0.05 + (0.05 - -0.05) * rng[i].uniform();
    steps[i] = 0;
  }
  void observe(int64_t i, float* obs) const {
    for (int c = 0; c < 4; ++c) obs[i * 4 + c] = static_cast<float>(s[i][c]);
  }
  void reset(uint64_t seed, float* obs) override {
    for (int64_t i = 0; i < n; ++i) {
      rng[i] = splitmix64{stream_seed(seed, static_cast<uint64_t>(i))};
      start(i);
      observe(i, obs);
    }
  }
  // Written as Gymnasium writes it, so that the doubles round the same way.
  static bool dynamics(std::array<double, 4>& st, int32_t action) {
    const double gravity = 9.8, masspole = 0.1, total_mass = masspole + 1.0, length = 0.5;
    const double polemass_length = masspole * length, tau = 0.02;
    auto& [x, x_dot, theta, theta_dot] = st;
    const double force = action == 1 ? 10.0 : -10.0;
    const double costheta = std::cos(theta), sintheta = std::sin(theta);
    const double temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass;
    const double thetaacc = (gravity * sintheta - costheta * temp) /
                            (length * (4.0 / 3.0 - masspole * (costheta * costheta) / total_mass));
    const double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    x = x + tau * x_dot;
    x_dot = x_dot + tau * xacc;
    theta = theta + tau * theta_dot;
    theta_dot = theta_dot + tau * thetaacc;
    const double theta_limit = 12 * 2 * M_PI / 360;
    return x < -2.4 || x > 2.4 || theta < -theta_limit || theta > theta_limit;
  }
  void step(const int32_t* actions, const troupe_env_step_out& out) override {
    for (int64_t i = 0; i < n; ++i) {
      const bool terminated = dynamics(s[i], actions[i]);
      const bool truncated = !terminated && ++steps[i] >= max_steps;
      out.reward[i] = 1.0f;
      out.terminated[i] = terminated;
      out.truncated[i] = truncated;
      if (terminated || truncated) {  // same-step auto-reset
        observe(i, out.final_obs);
        start(i);
      }
      observe(i, out.obs);
    }
  }
};

struct corridor final : troupe_env {
  int64_t n, length, max_steps;
  std::vector<int64_t> cell, steps;

  corridor(int64_t instances, int64_t cells, int64_t max_episode_steps)
      : n(instances), length(cells), max_steps(max_episode_steps), cell(n, 0), steps(n, 0) {}

  troupe_env_info info() const override {
    return {"Corridor-v0",
            TROUPE_DTYPE_FLOAT32,
            length,
            TROUPE_SPACE_DISCRETE,
            2,
            nullptr,
            nullptr,
            max_steps,
            0};
  }
  void observe(int64_t i, float* obs) const {
    for (int64_t c = 0; c < length; ++c) obs[i * length + c] = c == cell[i] ? 1.0f : 0.0f;
  }
  void reset(uint64_t, float* obs) override {  // every episode starts in cell 0
    for (int64_t i = 0; i < n; ++i) {
      cell[i] = steps[i] = 0;
      observe(i, obs);
    }
  }
  void step(const int32_t* actions, const troupe_env_step_out& out) override {
    for (int64_t i = 0; i < n; ++i) {
      cell[i] = std::max<int64_t>(0, cell[i] + (actions[i] == 1 ? 1 : -1));
      const bool terminated = cell[i] == length - 1;
      const bool truncated = !terminated && ++steps[i] >= max_steps;
      out.reward[i] = terminated ? 1.0f : -0.1f;
      out.terminated[i] = terminated;
      out.truncated[i] = truncated;
      if (terminated || truncated) {
        observe(i, out.final_obs);
        cell[i] = steps[i] = 0;
      }
      observe(i, out.obs);
    }
  }
};

// An integer keyword argument >= low, or the default; throws naming it.
int64_t int_kwarg(const nlohmann::json& kwargs, const char* key, int64_t fallback, int64_t low) {
  if (!kwargs.contains(key)) return fallback;
  const auto& v = kwargs[key];
  if (!v.is_number_integer() || v.get<int64_t>() < low)
    throw std::invalid_argument(
        std::string(key) + ": expected an integer >= " + std::to_string(low) + ", got " + v.dump());
  return v.get<int64_t>();
}

troupe_env* make(const std::string& id, int64_t instances, const nlohmann::json& kwargs) {
  for (const auto& [key, value] : kwargs.items())
    if (key != "max_episode_steps" && !(id == "Corridor-v0" && key == "length"))
      throw std::invalid_argument("unknown keyword argument '" + key + "' for " + id);
  if (id == "CartPole-v1")
    return new cartpole(instances, int_kwarg(kwargs, "max_episode_steps", 500, 1));
  if (id == "Corridor-v0")
    return new corridor(instances, int_kwarg(kwargs, "length", 5, 2),
                        int_kwarg(kwargs, "max_episode_steps", 20, 1));
  throw std::invalid_argument("no environment '" + id +
                              "' here (this plugin makes CartPole-v1 and "
                              "Corridor-v0)");
}

// Runs `f` on `env`: 0, or 1 with the exception's message kept for last_error.
template <class F>
int guarded(troupe_env* env, F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    env->error = e.what();
  } catch (...) {
    env->error = "an unknown exception";
  }
  return 1;
}

const troupe_env_plugin_api kApi = {
    TROUPE_ENV_PLUGIN_ABI_VERSION,
    [](const char* id, int64_t instances, const char* kwargs, char* error,
       size_t capacity) -> troupe_env* {
      try {
        return make(id, instances, nlohmann::json::parse(kwargs));
      } catch (const std::exception& e) {
        std::snprintf(error, capacity, "%s", e.what());
        return nullptr;
      }
    },
    [](troupe_env* env, troupe_env_info* info) {
      return guarded(env, [&] { *info = env->info(); });
    },
    [](troupe_env* env, uint64_t seed, float* obs) {
      return guarded(env, [&] { env->reset(seed, obs); });
    },
    [](troupe_env* env, const void* actions, const troupe_env_step_out* out) {
      return guarded(env, [&] { env->step(static_cast<const int32_t*>(actions), *out); });
    },
    [](troupe_env* env) { return env->error.c_str(); },
    [](troupe_env* env) { delete env; },
    [](troupe_env* env, int64_t i, double* state) {
      auto* c = static_cast<cartpole*>(env);  // only CartPole reports a state_size
      for (int k = 0; k < 4; ++k) state[k] = c->s[i][k];
      return 0;
    },
    [](troupe_env* env, int64_t i, const double* state) {
      auto* c = static_cast<cartpole*>(env);
      for (int k = 0; k < 4; ++k) c->s[i][k] = state[k];
      return 0;
    },
};

}  // namespace

const troupe_env_plugin_api* troupe_env_plugin(void) {
  return &kApi;
}
