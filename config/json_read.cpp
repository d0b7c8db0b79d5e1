#include "config/json_read.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "config/job_config.hpp"

namespace troupe::json_read {

namespace {

constexpr std::size_t kMaxShown = 60;

// Whether v has at most `budget` values in all, nested at most `depth`
// deep: only such a value is printed whole (a value nested 100,000 deep would
// overflow the stack in dump()).
bool small_value(const json& v, int depth, std::size_t& budget) {
  if (budget == 0) return false;
  --budget;
  if (!v.is_array() && !v.is_object()) return true;
  if (depth == 0) return false;
  for (const auto& e : v)
    if (!small_value(e, depth - 1, budget)) return false;
  return true;
}

}  // namespace

std::string show(const json& v) {
  std::size_t budget = kMaxShown;
  if (!small_value(v, 8, budget)) {
    if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
    if (v.is_object()) return "an object with " + std::to_string(v.size()) + " keys";
  }
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() <= kMaxShown) return s;
  if (v.is_string()) {
    std::string cut = v.get_ref<const std::string&>().substr(0, kMaxShown - 5);
    // Do not end inside a UTF-8 sequence.
    while (!cut.empty() && (static_cast<unsigned char>(cut.back()) & 0xC0) == 0x80) cut.pop_back();
    if (!cut.empty() && (static_cast<unsigned char>(cut.back()) & 0x80)) cut.pop_back();
    return json(cut + "...").dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
  if (v.is_object()) return "an object with " + std::to_string(v.size()) + " keys";
  return s;
}

std::string quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) out += ", ";
    out += quote(names[i]);
  }
  return out;
}

std::string one_of(const std::vector<std::string>& names) {
  return names.size() == 1 ? quoted_list(names) : "one of " + quoted_list(names);
}

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw config_error(path.empty() ? "(root)" : path, message);
}

[[noreturn]] void expected(const std::string& path, const std::string& what, const json& got) {
  fail(path, "expected " + what + ", got " + show(got));
}

std::string join(const std::string& path, std::string_view key) {
  const bool plain = std::none_of(key.begin(), key.end(), [](char ch) {
    return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f;
  });
  if (!plain) return path + "[" + quote(key) + "]";
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string index(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + cost});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

// ------------------------------------------------------------ value readers

int64_t read_int_in(const json& v, const std::string& path, int64_t min, int64_t max) {
  int64_t out = read_int(v, path, min);
  if (out > max)
    fail(path, "expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                   "], got " + show(v));
  return out;
}

int64_t read_int(const json& v, const std::string& path, int64_t min) {
  const std::string want = "an integer >= " + std::to_string(min);
  int64_t out = 0;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    out = v.get<int64_t>();
  } else if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      expected(path,
               want + " (at most " + std::to_string(std::numeric_limits<int64_t>::max()) + ")", v);
    out = static_cast<int64_t>(u);
  } else if (v.is_number_float()) {
    // An integral float (2.0, 1e3) is accepted; 1.5 is not.
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) expected(path, want, v);
    if (d < -9.2e18 || d > 9.2e18)
      expected(path,
               want + " (at most " + std::to_string(std::numeric_limits<int64_t>::max()) + ")", v);
    out = static_cast<int64_t>(d);
  } else {
    expected(path, want, v);
  }
  if (out < min) expected(path, want, v);
  return out;
}

uint64_t read_uint(const json& v, const std::string& path) {
  const std::string want = "an integer >= 0";
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) expected(path, want, v);
    return static_cast<uint64_t>(i);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || d < 0) expected(path, want, v);
    if (d >= 1.8e19) expected(path, want + " (at most 18446744073709551615)", v);
    return static_cast<uint64_t>(d);
  }
  expected(path, want, v);
}

std::string range::describe() const {
  auto num = [](double x) { return json(x).dump(); };
  auto trim = [](std::string s) {
    if (s.size() > 2 && s.ends_with(".0")) s.resize(s.size() - 2);
    return s;
  };
  if (!has_hi) return std::string("a number ") + (lo_open ? "> " : ">= ") + trim(num(lo));
  return std::string("a number in ") + (lo_open ? "(" : "[") + trim(num(lo)) + ", " +
         trim(num(hi)) + (hi_open ? ")" : "]");
}

double read_number(const json& v, const std::string& path, const range& r) {
  if (!v.is_number()) expected(path, r.describe(), v);
  double d = v.get<double>();
  if (!std::isfinite(d)) expected(path, "a finite number", v);
  if (!r.contains(d)) expected(path, r.describe(), v);
  return d;
}

bool read_bool(const json& v, const std::string& path) {
  if (!v.is_boolean()) expected(path, "true or false", v);
  return v.get<bool>();
}

std::string read_string(const json& v, const std::string& path, bool non_empty) {
  if (!v.is_string()) expected(path, non_empty ? "a non-empty string" : "a string", v);
  const auto& s = v.get_ref<const std::string&>();
  if (non_empty && s.empty()) expected(path, "a non-empty string", v);
  return s;
}

std::string read_enum(const json& v, const std::string& path,
                      const std::vector<std::string>& allowed) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (std::find(allowed.begin(), allowed.end(), s) != allowed.end()) return s;
  }
  expected(path, one_of(allowed), v);
}

object_reader::object_reader(const json& j, std::string path, std::vector<std::string> keys)
    : j_(j), path_(std::move(path)), keys_(std::move(keys)) {
  if (!j_.is_object()) fail(path_, std::string("expected a JSON object, got ") + j_.type_name());
  for (const auto& [key, value] : j_.items()) {
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) unknown(key);
  }
}

void object_reader::unknown(const std::string& raw) const {
  // A key's control characters (NUL, newline) would cut or split the
  // message: shown escaped, as JSON writes them.
  std::string key = json(raw).dump(-1, ' ', false, json::error_handler_t::replace);
  key = key.substr(1, key.size() - 2);
  std::size_t best = std::numeric_limits<std::size_t>::max();
  const std::string* suggestion = nullptr;
  for (const auto& k : keys_) {
    std::size_t d = edit_distance(key, k);
    if (d < best) {
      best = d;
      suggestion = &k;
    }
  }
  // Close enough to be a typo, and not a wholesale replacement of the key.
  if (suggestion && (best <= 2 || best * 3 <= suggestion->size()) && best < key.size())
    fail(path(key), "unknown key; did you mean \"" + *suggestion + "\"?");
  fail(path(key), "unknown key (expected one of: " + quoted_list(keys_) + ")");
}

}  // namespace troupe::json_read
