#include "envs/env.hpp"

#include <map>
#include <mutex>
#include <stdexcept>

#include "envs/builtin.hpp"

namespace troupe::envs {
namespace {

std::mutex registry_mtx;
std::map<std::string, env_factory>& registry() {
  static std::map<std::string, env_factory> r{{"CartPole-v1", &make_cartpole},
                                              {"Acrobot-v1", &make_acrobot}};
  return r;
}

}  // namespace

void register_env(const std::string& name, env_factory f) {
  std::lock_guard<std::mutex> g(registry_mtx);
  if (!registry().emplace(name, std::move(f)).second)
    throw std::invalid_argument("environment '" + name + "' is already registered");
}

std::vector<std::string> registered_envs() {
  std::lock_guard<std::mutex> g(registry_mtx);
  std::vector<std::string> r;
  for (auto& [k, _] : registry()) r.push_back(k);
  return r;
}

std::unique_ptr<vector_env> make_env(const std::string& name, int64_t instances) {
  env_factory f;
  {
    std::lock_guard<std::mutex> g(registry_mtx);
    auto i = registry().find(name);
    if (i != registry().end()) f = i->second;
  }
  if (!f) {
    std::string known;
    for (auto& k : registered_envs()) known += (known.empty() ? "" : ", ") + k;
    throw std::invalid_argument("unknown environment '" + name + "' (registered: " + known + ")");
  }
  return f(instances);
}

}  // namespace troupe::envs
