#pragma once
// Reading a job config's JSON: typed values with their allowed ranges, objects
// with known keys, and the messages a user reads when a value is wrong
// ("strategy.replicas: expected an integer >= 1, got -1"). Used by the
// schema (config/schema.cpp) and by every strategy for its own keys
// (config/strategy_keys.hpp). Every reader throws config_error naming the
// JSON path.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::json_read {

using nlohmann::json;

// A JSON value as the user wrote it, for "got ..." (short values verbatim).
std::string show(const json& v);
// A user's string as a JSON string literal, for messages: control
// characters escaped (a newline is \n), so a message stays one line.
std::string quote(std::string_view s);
// "a", "b" -> "\"a\", \"b\"" (each as quote() writes it).
std::string quoted_list(const std::vector<std::string>& names);
// What "expected ..." says of a choice: "\"a\"" or "one of \"a\", \"b\"".
std::string one_of(const std::vector<std::string>& names);

[[noreturn]] void fail(const std::string& path, const std::string& message);
// "<path>: expected <what>, got <v>".
[[noreturn]] void expected(const std::string& path, const std::string& what, const json& got);

// "a.b" from "a" and "b" (a["b\n"] when the key holds a control character);
// "a[3]" from "a" and 3.
std::string join(const std::string& path, std::string_view key);
std::string index(const std::string& path, std::size_t i);

int64_t read_int(const json& v, const std::string& path, int64_t min);
// An integer in [min, max]: sizes that allocate per unit (replicas,
// prefetched batches, environments) are bounded, so that a typo is an error,
// not an allocation of gigabytes.
int64_t read_int_in(const json& v, const std::string& path, int64_t min, int64_t max);
uint64_t read_uint(const json& v, const std::string& path);

// The allowed range of a real-valued field.
struct range {
  double lo = 0;
  bool lo_open = false;  // lo excluded
  bool has_hi = false;
  double hi = 0;
  bool hi_open = false;  // hi excluded

  bool contains(double x) const {
    if (lo_open ? !(x > lo) : !(x >= lo)) return false;
    if (has_hi && (hi_open ? !(x < hi) : !(x <= hi))) return false;
    return true;
  }
  std::string describe() const;
};

constexpr range positive{0, true};
constexpr range non_negative{0, false};
constexpr range unit_open_hi{0, false, true, 1, true};  // [0, 1)
constexpr range unit_open_lo{0, true, true, 1, false};  // (0, 1]
constexpr range unit_closed{0, false, true, 1, false};  // [0, 1]

double read_number(const json& v, const std::string& path, const range& r);
bool read_bool(const json& v, const std::string& path);
std::string read_string(const json& v, const std::string& path, bool non_empty);
std::string read_enum(const json& v, const std::string& path,
                      const std::vector<std::string>& allowed);

// An enum's spellings in the config, in the order the error lists them.
template <class E>
using enum_names = std::initializer_list<std::pair<E, const char*>>;

// The enum value a config string names; anything else is an error naming the
// path and every allowed spelling.
template <class E>
E read_named(const json& v, const std::string& path, enum_names<E> names) {
  std::vector<std::string> allowed;
  for (const auto& n : names) allowed.emplace_back(n.second);
  const auto s = read_enum(v, path, allowed);
  for (const auto& [value, name] : names)
    if (s == name) return value;
  return names.begin()->first;  // unreachable: read_enum accepted one of them
}

// The config spelling of `value` ("?" if the table lacks it).
template <class E>
const char* name_in(enum_names<E> names, E value) {
  for (const auto& [v, name] : names)
    if (v == value) return name;
  return "?";
}

// One JSON object of the schema: checks the type and the keys up front, then
// hands out the members that are present. An unknown key is an error, with
// "did you mean" when one is close.
class object_reader {
 public:
  object_reader(const json& j, std::string path, std::vector<std::string> keys);

  const std::string& path() const { return path_; }
  std::string path(std::string_view key) const { return join(path_, key); }

  // The member, or nullptr when the key is absent (the default stays).
  const json* get(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

  template <class F>
  void with(const std::string& key, F&& read) const {
    if (const json* v = get(key)) read(*v, path(key));
  }

 private:
  [[noreturn]] void unknown(const std::string& raw) const;

  const json& j_;
  std::string path_;
  std::vector<std::string> keys_;
};

}  // namespace troupe::json_read
