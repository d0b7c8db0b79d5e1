#include "config/strategy_rules.hpp"

#include <stdexcept>

#include "config/job_config.hpp"
#include "config/registry.hpp"

namespace troupe {
namespace {

named_registry<std::shared_ptr<const strategy_rules>>& the_registry() {
  static named_registry<std::shared_ptr<const strategy_rules>> r{"strategy"};
  return r;
}

}  // namespace

int64_t strategy_rules::replica_count(const job_config& c) const {
  return c.strategy.replicas;
}

void register_strategy_rules(std::shared_ptr<const strategy_rules> s) {
  if (!s) throw std::invalid_argument("register_strategy: null strategy");
  const auto name = s->name();
  the_registry().add(name, std::move(s));
}

std::shared_ptr<const strategy_rules> find_strategy_rules(const std::string& name) {
  return the_registry().find(name);
}

std::vector<std::string> registered_strategies() {
  return the_registry().names();
}

std::vector<std::string> strategies_with_key(const std::string& key) {
  std::vector<std::string> out;
  for (const auto& [name, rules] : the_registry().entries())
    for (const auto& k : rules->keys())
      if (k.name == key) {
        out.push_back(name);
        break;
      }
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
