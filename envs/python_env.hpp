#pragma once
// Gymnasium environments (Python) as a vector_env. A batch runs in a worker
// process of its own (envs/python/troupe_env_worker.py, started with
// rl.env.python), so the C++ side never holds a GIL and the rl_actors'
// workers step in parallel: observations, actions, rewards and the episode
// flags pass through shared memory (a memfd), and one JSON line each way on
// a socket pair rings the doorbell of every reset and step. Instance i of a
// batch reset with seed s is reset(seed=s + i) once; its later episodes
// continue that generator (Gymnasium's own semantics).
#include <optional>
#include <stdexcept>
#include <string>

#include "config/job_config.hpp"
#include "envs/env.hpp"

namespace troupe::envs {

// A Gymnasium environment that cannot start, with the config key at fault
// (rl.env.python, rl.env.id, rl.env.entry_point, rl.env.wrappers[i] or rl.env; for a native
// plugin rl.env.library or rl.env).
class env_start_error : public std::invalid_argument {
 public:
  env_start_error(std::string key, const std::string& message)
      : std::invalid_argument(message), key_(std::move(key)) {}
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

// Throws env_start_error when Python, Gymnasium, the id or the spaces fail;
// a failure while stepping (a Python exception, a dead worker) throws
// std::runtime_error naming the environment and the cause.
std::unique_ptr<vector_env> make_gymnasium_env(const gymnasium_env_config& g, int64_t instances);

// What rl.env selects: a built-in environment by name, a Gymnasium one, or
// a native plugin's.
struct env_choice {
  // A built-in environment's name converts (as make_env takes names).
  env_choice(std::string builtin) : name(std::move(builtin)) {}  // NOLINT
  env_choice(const char* builtin) : name(builtin) {}             // NOLINT
  env_choice(std::string id, std::optional<gymnasium_env_config> g,
             std::optional<plugin_env_config> p = {})
      : name(std::move(id)), gymnasium(std::move(g)), plugin(std::move(p)) {}
  std::string name;
  std::optional<gymnasium_env_config> gymnasium;
  std::optional<plugin_env_config> plugin;  // a native plugin (envs/plugin_env.hpp)
};

inline env_choice env_choice_of(const rl_config& rl) {
  return {rl.env, rl.gymnasium, rl.plugin};
}

std::unique_ptr<vector_env> make_job_env(const env_choice& c, int64_t instances);
// The spec of the choice's environment; a Gymnasium one's is asked once per
// process (starting Python takes a second) and kept.
env_spec job_env_spec(const env_choice& c);

}  // namespace troupe::envs
