#pragma once
// The strategy.* keys a strategy accepts. Each strategy lists its own
// (strategy_rules::keys(), in its file): how a key is read (type, range,
// errors naming the JSON path) and written back into the effective config.
// The schema knows no strategy's keys: it reads strategy.kind, then hands the
// other keys to that strategy's list; a key only other strategies list is
// refused naming the strategy.
//
// Keys several strategies share (replicas, reducer, shards...) are declared
// once here; a strategy's own key is declared in its file, either into a
// typed field of strategy_config the runtime reads (field_key) or, for a
// strategy added later, as a strategy_option kept in strategy_config::options.
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/job_config.hpp"
#include "config/json_read.hpp"

namespace troupe {

struct strategy_key {
  std::string name;
  // Validates v, found at JSON path `path`, and stores it in s.
  std::function<void(const nlohmann::json& v, const std::string& path, strategy_config& s)> read;
  // The value in effect (for to_json), the default when none was given.
  std::function<nlohmann::json(const strategy_config& s)> write;
};

// Reads a value at a JSON path, throwing config_error naming it.
template <class T>
using value_reader = std::function<T(const nlohmann::json&, const std::string& path)>;

// Readers for the usual kinds of value, in the schema's words.
value_reader<int64_t> integer_at_least(int64_t min);
value_reader<int64_t> integer_in(int64_t min, int64_t max);
value_reader<double> number_in(json_read::range r);
value_reader<bool> boolean();

// A key kept in one of strategy_config's typed fields; its default is the
// field's initializer.
template <class T>
strategy_key field_key(std::string name, T strategy_config::*field,
                       std::type_identity_t<value_reader<T>> read) {
  return {std::move(name),
          [field, read = std::move(read)](const nlohmann::json& v, const std::string& path,
                                          strategy_config& s) { s.*field = read(v, path); },
          [field](const strategy_config& s) { return nlohmann::json(s.*field); }};
}

// A strategy's own key that strategy_config has no field for: its value is
// kept in strategy_config::options under its name and read back typed with
// of(), which gives the default when the config did not set it (a
// job_config built in code has no options).
template <class T>
class strategy_option {
 public:
  strategy_option(std::string name, T default_value, value_reader<T> read)
      : name_(std::move(name)), default_(std::move(default_value)), read_(std::move(read)) {}

  const std::string& name() const { return name_; }
  T of(const strategy_config& s) const {
    auto it = s.options.find(name_);
    return it == s.options.end() ? default_ : it->template get<T>();
  }
  // Sets it in code, as the config would.
  void set(strategy_config& s, T value) const { s.options[name_] = std::move(value); }

  strategy_key key() const {
    return {name_,
            [o = *this](const nlohmann::json& v, const std::string& path, strategy_config& s) {
              o.set(s, o.read_(v, path));
            },
            [o = *this](const strategy_config& s) { return nlohmann::json(o.of(s)); }};
  }

 private:
  std::string name_;
  T default_;
  value_reader<T> read_;
};

// The keys several strategies share.
namespace strategy_keys {
// An integer in [1, 65536], or "auto" (config/schema.cpp resolves it).
strategy_key replicas();
// Micro-batches per update (gradient accumulation).
strategy_key steps_per_update();
// The reducer actors' settings; `algorithms` are the values of
// reducer.algorithm the strategy can run.
strategy_key reducer(std::vector<reducer_algorithm> algorithms);
// The variable shards and how variables are placed on them.
std::vector<strategy_key> variable_shards();
// How far the fastest worker may be ahead of the slowest (-1 = unbounded).
strategy_key max_staleness();
// Replicas that hold bit-identical variables: check them every N steps.
strategy_key check_replicas_every();
}  // namespace strategy_keys

}  // namespace troupe
