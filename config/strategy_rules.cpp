#include "config/strategy_rules.hpp"

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "config/job_config.hpp"

namespace troupe {
namespace {

struct registry {
  std::mutex mu;
  std::vector<std::shared_ptr<const strategy_rules>> entries;  // registration order
};

registry& the_registry() {
  static registry r;
  return r;
}

// The names the config has always listed, in this order (a listed name no
// strategy registers is refused by `troupe run` as "not implemented yet").
const std::vector<std::string> kListedNames = {"one_device",      "mirrored",
                                               "central_storage", "parameter_server",
                                               "elastic_average", "actor_learner"};

}  // namespace

int64_t strategy_rules::replica_count(const job_config& c) const {
  return c.strategy.replicas;
}

void register_strategy_rules(std::shared_ptr<const strategy_rules> s) {
  if (!s) throw std::invalid_argument("register_strategy: null strategy");
  auto& r = the_registry();
  std::lock_guard<std::mutex> g(r.mu);
  const auto name = s->name();
  for (const auto& e : r.entries)
    if (e->name() == name)
      throw std::invalid_argument("strategy '" + name + "' is already registered");
  r.entries.push_back(std::move(s));
}

std::shared_ptr<const strategy_rules> find_strategy_rules(const std::string& name) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> g(r.mu);
  for (const auto& e : r.entries)
    if (e->name() == name) return e;
  return nullptr;
}

std::vector<std::string> registered_strategies() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<std::string> out;
  for (const auto& e : r.entries) out.push_back(e->name());
  return out;
}

std::vector<std::string> known_strategy_names() {
  std::vector<std::string> out = kListedNames;
  for (auto& n : registered_strategies())
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  return out;
}

void check_global_batch_covers_replicas(const job_config& c) {
  if (c.data.batch_size < c.strategy.replicas)
    throw config_error("data.batch_size", "the global batch (" + std::to_string(c.data.batch_size) +
                                              ") must be >= strategy.replicas (" +
                                              std::to_string(c.strategy.replicas) +
                                              ") so every replica gets at least one example");
}

}  // namespace troupe
