#pragma once
// Environments for reinforcement learning, registered by name (as models
// are). An environment is always a batch of M instances of one kind stepped
// together (struct of arrays, one virtual call per batch step, not per
// instance): a single environment is a batch of one.
//
// Semantics (Gymnasium's, with same-step auto-reset as EnvPool and most
// actor/learner systems use):
//   reset(seed)   every instance i starts an episode from its own stream
//                 (seed, i); observations are written to obs [M, obs_size].
//   step(actions) every instance takes actions[i] (step_box: the row
//                 actions[i * action_dims ..] of a Box action space, which
//                 the environment clips to its bounds as Gymnasium's do) and
//                 reports the
//                 transition's reward, terminated (the MDP ended: no value
//                 after it) and truncated (the time limit cut it: the value
//                 after it still counts). An instance whose episode ended
//                 starts a new one at once: obs then holds the new episode's
//                 first observation, and final_obs row i the observation the
//                 old one ended in (a learner bootstraps from it on
//                 truncation), with the finished episode's return and length.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::envs {

struct env_spec {
  std::string name;  // e.g. "CartPole-v1"
  int64_t observation_size = 0;
  int64_t actions = 0;            // discrete actions 0..actions-1; 0 for a Box
  int64_t max_episode_steps = 0;  // truncation (Gymnasium's TimeLimit)
  // A Box action space (Gymnasium's spaces.Box, float32): one float per
  // dimension, bounded to [action_low[d], action_high[d]]; empty for
  // discrete actions.
  std::vector<float> action_low, action_high;
  // The observation's shape before it is flattened ([C, H, W] or [H, W] for
  // images: channels first, as conv2d takes them); empty means
  // [observation_size]. An env whose observations are bytes (uint8 pixels)
  // still writes floats, scaled to [0, 1]; observation_dtype says "uint8".
  std::vector<int64_t> observation_shape;
  std::string observation_dtype = "float32";
  bool continuous() const { return !action_low.empty(); }
  int64_t action_dims() const { return static_cast<int64_t>(action_low.size()); }
  // "Discrete(3)" or "Box(1) in [-2, 2]", for messages.
  std::string action_space() const;
};

// Where a batch step writes; every pointer has room for M entries (obs and
// final_obs: M * observation_size floats).
struct step_output {
  float* obs = nullptr;
  float* reward = nullptr;
  uint8_t* terminated = nullptr;
  uint8_t* truncated = nullptr;
  float* final_obs = nullptr;         // rows of instances whose episode ended
  double* episode_return = nullptr;   // of the episode that ended, else 0
  int64_t* episode_length = nullptr;  // of the episode that ended, else 0
};

class vector_env {
 public:
  virtual ~vector_env() = default;
  virtual const env_spec& spec() const = 0;
  virtual int64_t size() const = 0;  // M
  // Starts an episode in every instance; instance i draws its start from
  // the stream (seed, i) and every later episode from the same stream.
  virtual void reset(uint64_t seed, float* obs) = 0;
  // Throws std::invalid_argument naming the instance for an action out of
  // range (nothing is stepped then), and for any action of an environment
  // with a Box action space.
  virtual void step(const int32_t* actions, const step_output& out) = 0;
  // actions [M, action_dims]: clipped to the bounds by the environment.
  // Throws std::invalid_argument naming the instance for an action that is
  // not a finite number, and for an environment with discrete actions.
  virtual void step_box(const float* actions, const step_output& out) = 0;
  // The simulator's state of instance i (state_size() doubles, the
  // environment's own variables, e.g. CartPole's x, x_dot, theta,
  // theta_dot), to replay or test from a known state; the episode's step
  // count and return are kept.
  virtual int64_t state_size() const = 0;
  virtual void get_state(int64_t instance, double* state) const = 0;
  virtual void set_state(int64_t instance, const double* state) = 0;
};

// The checks of a step's actions that every vector_env makes, with the
// messages step and step_box above promise: std::invalid_argument naming
// the instance (and nothing stepped).
void check_discrete_actions(const env_spec& spec, int64_t instances, const int32_t* actions);
void check_box_actions(const env_spec& spec, int64_t instances, const float* actions);

using env_factory = std::function<std::unique_ptr<vector_env>(int64_t instances)>;

// Registers a factory under a name; throws std::invalid_argument if taken.
void register_env(const std::string& name, env_factory f);
// A batch of `instances` (>= 1) environments of that name; throws
// std::invalid_argument naming the registered ones for an unknown name.
std::unique_ptr<vector_env> make_env(const std::string& name, int64_t instances);
std::vector<std::string> registered_envs();

}  // namespace troupe::envs
