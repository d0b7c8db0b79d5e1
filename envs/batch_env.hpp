#pragma once
// What every built-in environment shares: M instances as a struct of arrays
// (one array per state component), each with its own random stream, the
// time limit, episode bookkeeping and same-step auto-reset. An environment
// kind supplies only its dynamics:
//
//   struct dynamics {
//     static constexpr int state_size = K;
//     static env_spec spec();
//     static void reset(splitmix64& rng, double* s);           // a start state
//     static bool step(double* s, int32_t action, double& reward);  // true: terminated
//     static void observe(const double* s, float* obs);
//   };
//
// A kind with a Box action space declares `static constexpr int action_dims`
// and steps with `static bool step(double* s, const float* action, double&
// reward)` (action_dims floats, clipped by the dynamics as Gymnasium's are).
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "envs/env.hpp"
#include "models/random.hpp"

namespace troupe::envs {

template <class D>
concept box_dynamics = requires {
  D::action_dims;
};

template <class D>
class batch_env final : public vector_env {
 public:
  explicit batch_env(int64_t instances) : spec_(D::spec()), n_(instances) {
    if (instances < 1)
      throw std::invalid_argument(spec_.name + ": expected at least 1 instance, got " +
                                  std::to_string(instances));
    for (auto& c : state_) c.assign(static_cast<std::size_t>(n_), 0.0);
    rng_.assign(static_cast<std::size_t>(n_), splitmix64(0));
    steps_.assign(static_cast<std::size_t>(n_), 0);
    returns_.assign(static_cast<std::size_t>(n_), 0.0);
  }

  const env_spec& spec() const override { return spec_; }
  int64_t size() const override { return n_; }
  int64_t state_size() const override { return D::state_size; }
  void get_state(int64_t instance, double* s) const override { load(checked(instance), s); }
  void set_state(int64_t instance, const double* s) override { store(checked(instance), s); }

  void reset(uint64_t seed, float* obs) override {
    for (int64_t i = 0; i < n_; ++i) {
      const auto k = static_cast<std::size_t>(i);
      rng_[k] = splitmix64(derive_seed(seed, static_cast<uint64_t>(i)));
      double s[D::state_size];
      D::reset(rng_[k], s);
      store(k, s);
      steps_[k] = 0;
      returns_[k] = 0;
      D::observe(s, obs + i * spec_.observation_size);
    }
  }

  void step(const int32_t* actions, const step_output& out) override {
    check_discrete_actions(spec_, n_, actions);  // throws for a Box kind
    if constexpr (!box_dynamics<D>)
      advance(out, [actions](double* s, int64_t i, double& reward) {
        return D::step(s, actions[i], reward);
      });
  }

  void step_box(const float* actions, const step_output& out) override {
    check_box_actions(spec_, n_, actions);  // throws for a discrete kind
    if constexpr (box_dynamics<D>) {
      constexpr int64_t dims = D::action_dims;
      advance(out, [actions](double* s, int64_t i, double& reward) {
        return D::step(s, actions + i * dims, reward);
      });
    }
  }

 private:
  // Steps every instance with dynamics_step(state, instance, reward) (true:
  // terminated): the time limit, the episode's bookkeeping, auto-reset.
  template <class Step>
  void advance(const step_output& out, Step dynamics_step) {
    const int64_t obs_n = spec_.observation_size;
    for (int64_t i = 0; i < n_; ++i) {
      const auto k = static_cast<std::size_t>(i);
      double s[D::state_size];
      load(k, s);
      double reward = 0;
      const bool terminated = dynamics_step(s, i, reward);
      const bool truncated = !terminated && ++steps_[k] >= spec_.max_episode_steps;
      if (terminated) ++steps_[k];
      returns_[k] += reward;
      out.reward[i] = static_cast<float>(reward);
      out.terminated[i] = terminated ? 1 : 0;
      out.truncated[i] = truncated ? 1 : 0;
      out.episode_return[i] = 0;
      out.episode_length[i] = 0;
      if (terminated || truncated) {
        D::observe(s, out.final_obs + i * obs_n);
        out.episode_return[i] = returns_[k];
        out.episode_length[i] = steps_[k];
        D::reset(rng_[k], s);
        steps_[k] = 0;
        returns_[k] = 0;
      }
      store(k, s);
      D::observe(s, out.obs + i * obs_n);
    }
  }

  std::size_t checked(int64_t instance) const {
    if (instance < 0 || instance >= n_)
      throw std::out_of_range(spec_.name + ": no instance " + std::to_string(instance) + " of " +
                              std::to_string(n_));
    return static_cast<std::size_t>(instance);
  }
  void load(std::size_t k, double* s) const {
    for (int c = 0; c < D::state_size; ++c) s[c] = state_[static_cast<std::size_t>(c)][k];
  }
  void store(std::size_t k, const double* s) {
    for (int c = 0; c < D::state_size; ++c) state_[static_cast<std::size_t>(c)][k] = s[c];
  }

  env_spec spec_;
  int64_t n_;
  std::array<std::vector<double>, D::state_size> state_;  // component c of every instance
  std::vector<splitmix64> rng_;
  std::vector<int64_t> steps_;   // steps of the running episode
  std::vector<double> returns_;  // return of the running episode
};

// Uniform in [low, high) from the instance's stream.
inline double uniform(splitmix64& rng, double low, double high) {
  return low + (high - low) * rng.uniform();
}

}  // namespace troupe::envs
