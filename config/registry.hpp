#pragma once
// A registry of entries by name, safe to use from any thread: the one
// mechanism behind strategies (config/strategy_rules.hpp), models
// (models/model.hpp), device models, policy/value models
// (models/policy_value.hpp) and environments (envs/env.hpp). Each keeps one
// as a function-local static, seeded with its built-ins or filled by
// registrations at start-up. It lives in config/, the lowest layer that
// names things a job config selects. Names are listed sorted, so that
// "expected one of ..." reads the same whatever the link order.
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

// Entry: a factory or a shared object; an empty (default) Entry means "none".
template <class Entry>
class named_registry {
 public:
  // `what` names an entry in messages: "<what> 'x' is already registered".
  explicit named_registry(std::string what, std::map<std::string, Entry> builtins = {})
      : what_(std::move(what)), entries_(std::move(builtins)) {}

  // Throws std::invalid_argument when the name is taken.
  void add(const std::string& name, Entry f) {
    std::lock_guard<std::mutex> g(mu_);
    if (!entries_.emplace(name, std::move(f)).second)
      throw std::invalid_argument(what_ + " '" + name + "' is already registered");
  }

  // The entry of that name; empty when there is none.
  Entry find(const std::string& name) const {
    std::lock_guard<std::mutex> g(mu_);
    auto i = entries_.find(name);
    return i == entries_.end() ? Entry{} : i->second;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::string> r;
    for (const auto& [k, _] : entries_) r.push_back(k);
    return r;
  }

  // Every entry with its name, sorted by name.
  std::vector<std::pair<std::string, Entry>> entries() const {
    std::lock_guard<std::mutex> g(mu_);
    return {entries_.begin(), entries_.end()};
  }

  // The names, comma-separated, for "unknown ... (registered: ...)".
  std::string known() const {
    std::string s;
    for (const auto& n : names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }

 private:
  std::string what_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace troupe
