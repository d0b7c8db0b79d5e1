#pragma once
// A registry of factories by name, safe to use from any thread: what models
// (models/model.hpp), policy/value models (models/policy_value.hpp) and
// environments (envs/env.hpp) share. Each keeps one as a function-local
// static, seeded with its built-ins.
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

template <class Factory>
class named_registry {
 public:
  // `what` names an entry in messages: "<what> 'x' is already registered".
  named_registry(std::string what, std::map<std::string, Factory> builtins)
      : what_(std::move(what)), entries_(std::move(builtins)) {}

  // Throws std::invalid_argument when the name is taken.
  void add(const std::string& name, Factory f) {
    std::lock_guard<std::mutex> g(mu_);
    if (!entries_.emplace(name, std::move(f)).second)
      throw std::invalid_argument(what_ + " '" + name + "' is already registered");
  }

  // The factory of that name; empty when there is none.
  Factory find(const std::string& name) const {
    std::lock_guard<std::mutex> g(mu_);
    auto i = entries_.find(name);
    return i == entries_.end() ? Factory{} : i->second;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::string> r;
    for (const auto& [k, _] : entries_) r.push_back(k);
    return r;
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
  std::map<std::string, Factory> entries_;
};

}  // namespace troupe
