#include "envs/env.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "config/registry.hpp"
#include "envs/builtin.hpp"
#include "envs/policy_head.hpp"

namespace troupe::envs {
namespace {

named_registry<env_factory>& registry() {
  static named_registry<env_factory> r{"environment",
                                       {{"CartPole-v1", &make_cartpole},
                                        {"Acrobot-v1", &make_acrobot},
                                        {"MountainCar-v0", &make_mountain_car},
                                        {"MountainCarContinuous-v0", &make_mountain_car_continuous},
                                        {"Pendulum-v1", &make_pendulum}}};
  return r;
}

std::string number(float x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

std::string env_spec::action_space() const {
  if (!continuous()) return "Discrete(" + std::to_string(actions) + ")";
  std::string out = "Box(" + std::to_string(action_dims()) + ") in ";
  for (std::size_t d = 0; d < action_low.size(); ++d)
    out += (d ? " x [" : "[") + number(action_low[d]) + ", " + number(action_high[d]) + "]";
  return out;
}

void check_discrete_actions(const env_spec& spec, int64_t instances, const int32_t* actions) {
  if (spec.continuous())
    throw std::invalid_argument(spec.name + ": expected continuous actions (" +
                                spec.action_space() + "), got discrete ones");
  for (int64_t i = 0; i < instances; ++i)
    if (actions[i] < 0 || actions[i] >= spec.actions)
      throw std::invalid_argument(spec.name + ": instance " + std::to_string(i) + ": action " +
                                  std::to_string(actions[i]) + " is out of range [0, " +
                                  std::to_string(spec.actions) + ")");
}

void check_box_actions(const env_spec& spec, int64_t instances, const float* actions) {
  if (!spec.continuous())
    throw std::invalid_argument(spec.name + ": expected a discrete action (" + spec.action_space() +
                                "), got continuous ones");
  const int64_t dims = spec.action_dims();
  for (int64_t i = 0; i < instances * dims; ++i)
    if (!std::isfinite(actions[i]))
      throw std::invalid_argument(spec.name + ": instance " + std::to_string(i / dims) +
                                  ": action component " + std::to_string(i % dims) +
                                  " is not a finite number");
}

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

namespace troupe::envs {

policy_head policy_head_for(const env_spec& spec, const std::string& choice,
                            double initial_log_std) {
  const std::string fits = spec.continuous() ? "gaussian" : "softmax";
  if (choice != "auto" && choice != "softmax" && choice != "gaussian")
    throw std::invalid_argument("unknown policy head \"" + choice +
                                "\" (expected \"auto\", \"softmax\" or \"gaussian\")");
  if (choice != "auto" && choice != fits)
    throw std::invalid_argument("the \"" + choice + "\" policy head does not fit " + spec.name +
                                ", whose actions are " + spec.action_space() + ": use \"" + fits +
                                "\" (or \"auto\")");
  if (spec.continuous())
    return {action_distribution::gaussian, spec.action_dims(), initial_log_std};
  return {action_distribution::softmax, spec.actions, 0};
}

}  // namespace troupe::envs
