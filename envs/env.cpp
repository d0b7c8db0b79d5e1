#include "envs/env.hpp"

#include <stdexcept>

#include "config/registry.hpp"
#include "envs/builtin.hpp"

namespace troupe::envs {
namespace {

named_registry<env_factory>& registry() {
  static named_registry<env_factory> r{
      "environment", {{"CartPole-v1", &make_cartpole}, {"Acrobot-v1", &make_acrobot}}};
  return r;
}

}  // namespace

void register_env(const std::string& name, env_factory f) {
  registry().add(name, std::move(f));
}

std::vector<std::string> registered_envs() {
  return registry().names();
}

std::unique_ptr<vector_env> make_env(const std::string& name, int64_t instances) {
  auto f = registry().find(name);
  if (!f)
    throw std::invalid_argument("unknown environment '" + name +
                                "' (registered: " + registry().known() + ")");
  return f(instances);
}

}  // namespace troupe::envs
