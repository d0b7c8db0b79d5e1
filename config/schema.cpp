// The JSON schema of a job: names, types, ranges, cross-field rules, and the
// error messages a user reads when a config is wrong.
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "config/job_config.hpp"
#include "config/strategy_rules.hpp"

namespace troupe {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------- messages

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

// A JSON value as the user wrote it, for "got ..." (short values verbatim).
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

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) out += ", ";
    out += '"' + names[i] + '"';
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw config_error(path.empty() ? "(root)" : path, message);
}

[[noreturn]] void expected(const std::string& path, const std::string& what, const json& got) {
  fail(path, "expected " + what + ", got " + show(got));
}

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string index(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

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

// ------------------------------------------------------------ value readers

int64_t read_int(const json& v, const std::string& path, int64_t min);

// An integer in [min, max]: sizes that allocate per unit (replicas,
// prefetched batches, environments) are bounded, so that a typo is an error,
// not an allocation of gigabytes.
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
  std::string describe() const {
    auto num = [](double x) { return json(x).dump(); };
    auto trim = [](std::string s) {
      if (s.size() > 2 && s.ends_with(".0")) s.resize(s.size() - 2);
      return s;
    };
    if (!has_hi) return std::string("a number ") + (lo_open ? "> " : ">= ") + trim(num(lo));
    return std::string("a number in ") + (lo_open ? "(" : "[") + trim(num(lo)) + ", " +
           trim(num(hi)) + (hi_open ? ")" : "]");
  }
};

constexpr range positive{0, true};
constexpr range non_negative{0, false};
constexpr range unit_open_hi{0, false, true, 1, true};  // [0, 1)
constexpr range unit_open_lo{0, true, true, 1, false};  // (0, 1]

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
  std::string want =
      allowed.size() == 1 ? "\"" + allowed[0] + "\"" : "one of " + quoted_list(allowed);
  expected(path, want, v);
}

// ------------------------------------------------------------ object reader

// One JSON object of the schema: checks the type and the keys up front, then
// hands out the members that are present.
class object_reader {
 public:
  object_reader(const json& j, std::string path, std::vector<std::string> keys)
      : j_(j), path_(std::move(path)), keys_(std::move(keys)) {
    if (!j_.is_object()) fail(path_, std::string("expected a JSON object, got ") + j_.type_name());
    for (const auto& [key, value] : j_.items()) {
      if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) unknown(key);
    }
  }

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
  [[noreturn]] void unknown(const std::string& raw) const {
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

  const json& j_;
  std::string path_;
  std::vector<std::string> keys_;
};

// ------------------------------------------------------------------ sections

const std::vector<std::string> kActivations = {"relu", "tanh"};
const std::vector<std::string> kInits = {"auto", "he", "glorot"};
const std::vector<std::string> kOptimizers = {"sgd", "momentum", "adam", "rmsprop"};
const std::vector<std::string> kSchedules = {"constant", "step", "cosine"};
const std::vector<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "off"};

std::string read_name(const json& v, const std::string& path) {
  // The name becomes a directory (runs/<name>), so keep it to a safe alphabet.
  const std::string want = "a non-empty name of letters, digits, '.', '_' or '-'";
  if (!v.is_string()) expected(path, want, v);
  const auto& s = v.get_ref<const std::string&>();
  bool ok = !s.empty() && s != "." && s != "..";
  for (char c : s) {
    bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && c != '.' && c != '_' && c != '-') ok = false;
  }
  if (!ok) expected(path, want, v);
  return s;
}

void read_model(const json& j, const std::string& path, model_config& m) {
  object_reader r(j, path, {"kind", "hidden", "activation", "init"});
  r.with("kind", [&](const json& v, const std::string& p) {
    m.kind = read_enum(v, p, known_model_kinds());
  });
  r.with("hidden", [&](const json& v, const std::string& p) {
    if (!v.is_array()) expected(p, "an array of integers >= 1", v);
    m.hidden.clear();
    for (std::size_t i = 0; i < v.size(); ++i) m.hidden.push_back(read_int(v[i], index(p, i), 1));
  });
  r.with("activation", [&](const json& v, const std::string& p) {
    m.activation = read_enum(v, p, kActivations);
  });
  r.with("init", [&](const json& v, const std::string& p) { m.init = read_enum(v, p, kInits); });
}

void read_schedule(const json& j, const std::string& path, schedule_config& s) {
  object_reader r(j, path, {"kind", "warmup_steps", "step_size", "gamma", "decay_steps", "min_lr"});
  r.with("kind",
         [&](const json& v, const std::string& p) { s.kind = read_enum(v, p, kSchedules); });
  r.with("warmup_steps",
         [&](const json& v, const std::string& p) { s.warmup_steps = read_int(v, p, 0); });
  r.with("step_size",
         [&](const json& v, const std::string& p) { s.step_size = read_int(v, p, 1); });
  r.with("gamma",
         [&](const json& v, const std::string& p) { s.gamma = read_number(v, p, unit_open_lo); });
  r.with("decay_steps",
         [&](const json& v, const std::string& p) { s.decay_steps = read_int(v, p, 0); });
  r.with("min_lr",
         [&](const json& v, const std::string& p) { s.min_lr = read_number(v, p, non_negative); });
}

void read_optimizer(const json& j, const std::string& path, optimizer_config& o) {
  object_reader r(j, path,
                  {"kind", "learning_rate", "momentum", "nesterov", "beta1", "beta2", "epsilon",
                   "rho", "weight_decay", "decoupled_weight_decay", "schedule"});
  r.with("kind",
         [&](const json& v, const std::string& p) { o.kind = read_enum(v, p, kOptimizers); });
  r.with("learning_rate", [&](const json& v, const std::string& p) {
    o.learning_rate = read_number(v, p, positive);
  });
  r.with("momentum", [&](const json& v, const std::string& p) {
    o.momentum = read_number(v, p, unit_open_hi);
  });
  r.with("nesterov", [&](const json& v, const std::string& p) { o.nesterov = read_bool(v, p); });
  r.with("beta1",
         [&](const json& v, const std::string& p) { o.beta1 = read_number(v, p, unit_open_hi); });
  r.with("beta2",
         [&](const json& v, const std::string& p) { o.beta2 = read_number(v, p, unit_open_hi); });
  r.with("epsilon",
         [&](const json& v, const std::string& p) { o.epsilon = read_number(v, p, positive); });
  r.with("rho",
         [&](const json& v, const std::string& p) { o.rho = read_number(v, p, unit_open_hi); });
  r.with("weight_decay", [&](const json& v, const std::string& p) {
    o.weight_decay = read_number(v, p, non_negative);
  });
  r.with("decoupled_weight_decay",
         [&](const json& v, const std::string& p) { o.decoupled_weight_decay = read_bool(v, p); });
  r.with("schedule", [&](const json& v, const std::string& p) { read_schedule(v, p, o.schedule); });
}

void read_data(const json& j, const std::string& path, data_config& d) {
  object_reader r(j, path,
                  {"dataset", "path", "batch_size", "shuffle", "normalize", "prefetch", "gather",
                   "train_limit", "test_limit"});
  r.with("dataset", [&](const json& v, const std::string& p) {
    d.dataset = read_enum(v, p, {"fashion_mnist"});
  });
  r.with("path", [&](const json& v, const std::string& p) { d.path = read_string(v, p, true); });
  r.with("batch_size",
         [&](const json& v, const std::string& p) { d.batch_size = read_int(v, p, 1); });
  r.with("shuffle", [&](const json& v, const std::string& p) { d.shuffle = read_bool(v, p); });
  r.with("normalize", [&](const json& v, const std::string& p) { d.normalize = read_bool(v, p); });
  r.with("prefetch",
         [&](const json& v, const std::string& p) { d.prefetch = read_int_in(v, p, 1, 1024); });
  r.with("gather", [&](const json& v, const std::string& p) {
    d.gather = read_enum(v, p, {"auto", "pipeline", "device"});
  });
  r.with("train_limit",
         [&](const json& v, const std::string& p) { d.train_limit = read_int(v, p, 0); });
  r.with("test_limit",
         [&](const json& v, const std::string& p) { d.test_limit = read_int(v, p, 0); });
}

void read_reducer(const json& j, const std::string& path, reducer_settings& s) {
  object_reader r(j, path, {"algorithm", "bucket_bytes", "chunk_bytes", "hierarchical"});
  r.with("algorithm", [&](const json& v, const std::string& p) {
    s.algorithm = read_enum(v, p, {"ring", "tree", "reduce_to_one", "nccl"});
  });
  r.with("bucket_bytes",
         [&](const json& v, const std::string& p) { s.bucket_bytes = read_int(v, p, 4); });
  r.with("chunk_bytes",
         [&](const json& v, const std::string& p) { s.chunk_bytes = read_int(v, p, 4); });
  r.with("hierarchical",
         [&](const json& v, const std::string& p) { s.hierarchical = read_bool(v, p); });
}

void read_partitioner(const json& j, const std::string& path, partitioner_config& c) {
  object_reader r(j, path, {"kind", "max_shard_bytes", "min_slice_bytes", "fixed_shards"});
  r.with("kind", [&](const json& v, const std::string& p) {
    c.kind = read_enum(v, p, {"round_robin", "greedy_bytes", "fixed_shards", "min_max_bytes"});
  });
  r.with("max_shard_bytes",
         [&](const json& v, const std::string& p) { c.max_shard_bytes = read_int(v, p, 0); });
  r.with("min_slice_bytes",
         [&](const json& v, const std::string& p) { c.min_slice_bytes = read_int(v, p, 1); });
  r.with("fixed_shards",
         [&](const json& v, const std::string& p) { c.fixed_shards = read_int(v, p, 0); });
}

void read_strategy(const json& j, const std::string& path, strategy_config& s) {
  object_reader r(j, path,
                  {"kind", "replicas", "steps_per_update", "reducer", "shard_optimizer",
                   "check_replicas_every", "shards", "partitioner", "max_staleness",
                   "communication_period", "moving_rate", "rho", "synchronous"});
  r.with("kind", [&](const json& v, const std::string& p) {
    s.kind = read_enum(v, p, known_strategy_names());
  });
  r.with("replicas", [&](const json& v, const std::string& p) {
    s.replicas_auto = v.is_string() && v.get_ref<const std::string&>() == "auto";
    if (s.replicas_auto) return;
    if (v.is_string()) expected(p, "an integer in [1, 65536] or \"auto\"", v);
    s.replicas = read_int_in(v, p, 1, 65536);
  });
  r.with("steps_per_update",
         [&](const json& v, const std::string& p) { s.steps_per_update = read_int(v, p, 1); });
  r.with("reducer", [&](const json& v, const std::string& p) { read_reducer(v, p, s.reducer); });
  r.with("shards",
         [&](const json& v, const std::string& p) { s.shards = read_int_in(v, p, 1, 65536); });
  r.with("partitioner",
         [&](const json& v, const std::string& p) { read_partitioner(v, p, s.partitioner); });
  r.with("communication_period",
         [&](const json& v, const std::string& p) { s.communication_period = read_int(v, p, 1); });
  r.with("moving_rate", [&](const json& v, const std::string& p) {
    s.moving_rate = read_number(v, p, range{0, false, true, 1, false});  // [0, 1]
  });
  r.with("rho",
         [&](const json& v, const std::string& p) { s.rho = read_number(v, p, non_negative); });
  r.with("synchronous",
         [&](const json& v, const std::string& p) { s.synchronous = read_bool(v, p); });
  r.with("max_staleness",
         [&](const json& v, const std::string& p) { s.max_staleness = read_int(v, p, -1); });
  r.with("shard_optimizer",
         [&](const json& v, const std::string& p) { s.shard_optimizer = read_bool(v, p); });
  r.with("check_replicas_every",
         [&](const json& v, const std::string& p) { s.check_replicas_every = read_int(v, p, -1); });
}

// "cpu:N" or "cuda:N", N a decimal index without sign or leading zeros.
bool valid_device(const std::string& s) {
  std::string_view rest;
  if (s.starts_with("cpu:"))
    rest = std::string_view(s).substr(4);
  else if (s.starts_with("cuda:"))
    rest = std::string_view(s).substr(5);
  else if (s.starts_with("sim:"))  // a CPU device standing in for an accelerator (tests)
    rest = std::string_view(s).substr(4);
  else
    return false;
  if (rest.empty() || rest.size() > 9) return false;
  if (rest.size() > 1 && rest[0] == '0') return false;
  return std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> read_devices(const json& v, const std::string& p) {
  const std::string want_list = "a non-empty array of \"cpu:N\" or \"cuda:N\" strings";
  if (!v.is_array() || v.empty()) expected(p, want_list, v);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (!e.is_string() || !valid_device(e.get_ref<const std::string&>()))
      expected(index(p, i), "\"cpu:N\" or \"cuda:N\"", e);
    const auto& s = e.get_ref<const std::string&>();
    auto dup = std::find(out.begin(), out.end(), s);
    if (dup != out.end())
      fail(index(p, i), "duplicate device " + show(e) + " (already " +
                            index(p, static_cast<std::size_t>(dup - out.begin())) + ")");
    out.push_back(s);
  }
  return out;
}

void read_training(const json& j, const std::string& path, training_config& t) {
  object_reader r(j, path,
                  {"epochs", "max_steps", "eval_every_epochs", "max_env_steps", "target_return"});
  r.with("max_env_steps",
         [&](const json& v, const std::string& p) { t.max_env_steps = read_int(v, p, 0); });
  r.with("target_return", [&](const json& v, const std::string& p) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) expected(p, "a finite number", v);
    t.target_return = v.get<double>();
  });
  r.with("epochs", [&](const json& v, const std::string& p) { t.epochs = read_int(v, p, 1); });
  r.with("max_steps",
         [&](const json& v, const std::string& p) { t.max_steps = read_int(v, p, 0); });
  r.with("eval_every_epochs",
         [&](const json& v, const std::string& p) { t.eval_every_epochs = read_int(v, p, 0); });
}

void read_rl(const json& j, const std::string& path, rl_config& c) {
  object_reader r(j, path,
                  {"env", "actors", "envs_per_actor", "unroll_length", "batch_unrolls", "discount",
                   "reward_scale", "rho_bar", "c_bar", "baseline_cost", "entropy_cost", "grad_clip",
                   "learners", "weights_every", "max_policy_lag", "queue_capacity"});
  // The environment's name is checked against the registry by the strategy.
  r.with("env", [&](const json& v, const std::string& p) { c.env = read_string(v, p, true); });
  r.with("actors",
         [&](const json& v, const std::string& p) { c.actors = read_int_in(v, p, 1, 65536); });
  r.with("envs_per_actor", [&](const json& v, const std::string& p) {
    c.envs_per_actor = read_int_in(v, p, 1, 1 << 20);
  });
  r.with("unroll_length", [&](const json& v, const std::string& p) {
    c.unroll_length = read_int_in(v, p, 1, 1 << 20);
  });
  r.with("batch_unrolls", [&](const json& v, const std::string& p) {
    c.batch_unrolls = read_int_in(v, p, 1, 65536);
  });
  r.with("discount", [&](const json& v, const std::string& p) {
    c.discount = read_number(v, p, unit_open_lo);
  });
  r.with("reward_scale", [&](const json& v, const std::string& p) {
    c.reward_scale = read_number(v, p, positive);
  });
  r.with("rho_bar",
         [&](const json& v, const std::string& p) { c.rho_bar = read_number(v, p, positive); });
  r.with("c_bar",
         [&](const json& v, const std::string& p) { c.c_bar = read_number(v, p, positive); });
  r.with("baseline_cost", [&](const json& v, const std::string& p) {
    c.baseline_cost = read_number(v, p, non_negative);
  });
  r.with("entropy_cost", [&](const json& v, const std::string& p) {
    c.entropy_cost = read_number(v, p, non_negative);
  });
  r.with("grad_clip", [&](const json& v, const std::string& p) {
    c.grad_clip = read_number(v, p, non_negative);
  });
  r.with("learners",
         [&](const json& v, const std::string& p) { c.learners = read_int_in(v, p, 1, 4096); });
  r.with("weights_every",
         [&](const json& v, const std::string& p) { c.weights_every = read_int(v, p, 1); });
  r.with("max_policy_lag",
         [&](const json& v, const std::string& p) { c.max_policy_lag = read_int(v, p, -1); });
  r.with("queue_capacity", [&](const json& v, const std::string& p) {
    c.queue_capacity = read_int_in(v, p, 1, 65536);
  });
}

void read_checkpoint(const json& j, const std::string& path, checkpoint_config& c) {
  object_reader r(j, path, {"dir", "every_steps", "keep", "save_at_end", "save_local_copies"});
  r.with("dir", [&](const json& v, const std::string& p) { c.dir = read_string(v, p, false); });
  r.with("every_steps",
         [&](const json& v, const std::string& p) { c.every_steps = read_int(v, p, 0); });
  r.with("keep", [&](const json& v, const std::string& p) { c.keep = read_int(v, p, 0); });
  r.with("save_at_end",
         [&](const json& v, const std::string& p) { c.save_at_end = read_bool(v, p); });
  r.with("save_local_copies",
         [&](const json& v, const std::string& p) { c.save_local_copies = read_bool(v, p); });
}

void read_logging(const json& j, const std::string& path, logging_config& l) {
  object_reader r(j, path, {"level", "every_steps", "output_dir"});
  r.with("level", [&](const json& v, const std::string& p) { l.level = read_enum(v, p, kLevels); });
  r.with("every_steps",
         [&](const json& v, const std::string& p) { l.every_steps = read_int(v, p, 1); });
  r.with("output_dir",
         [&](const json& v, const std::string& p) { l.output_dir = read_string(v, p, false); });
}

// An environment variable's name: letters, digits and '_', not starting with a digit.
std::string read_env_name(const json& v, const std::string& path) {
  const std::string want = "an environment variable name (letters, digits, '_')";
  if (!v.is_string()) expected(path, want, v);
  const auto& s = v.get_ref<const std::string&>();
  bool ok = !s.empty() && !(s[0] >= '0' && s[0] <= '9');
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      ok = false;
  if (!ok) expected(path, want, v);
  return s;
}

std::vector<int64_t> read_index_list(const json& v, const std::string& path) {
  if (!v.is_array()) expected(path, "an array of integers >= 0", v);
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(read_int(v[i], index(path, i), 0));
  return out;
}

// The cluster spec (config/cluster.hpp): shapes and values here, the rules
// that involve other fields (a chief, placement vs strategy) in check_cluster.
void read_cluster(const json& j, const std::string& path, cluster_spec& c) {
  object_reader r(
      j, path,
      {"tasks", "hosts", "join_timeout_seconds", "heartbeat_seconds", "secret_env", "secret_file"});
  if (!r.get("tasks"))
    fail(r.path("tasks"),
         "missing; expected an object like {\"chief\": [\"127.0.0.1:7000\"], \"worker\": "
         "[\"127.0.0.1:7001\"]}");
  r.with("tasks", [&](const json& v, const std::string& p) {
    object_reader t(v, p, cluster_job_names());
    std::vector<std::pair<std::string, std::string>> seen;  // normalized address, its path
    for (const auto& name : cluster_job_names())
      t.with(name, [&](const json& list, const std::string& lp) {
        if (!list.is_array() || list.empty())
          expected(lp, "a non-empty array of \"host:port\" strings", list);
        auto& addresses = c.tasks[name];
        for (std::size_t i = 0; i < list.size(); ++i) {
          const std::string ip = index(lp, i);
          if (!list[i].is_string()) expected(ip, "\"host:port\"", list[i]);
          const auto& s = list[i].get_ref<const std::string&>();
          host_port hp;
          try {
            hp = parse_host_port(s);
          } catch (const std::invalid_argument& e) {
            fail(ip, e.what());
          }
          std::string key = hp.host;
          std::transform(key.begin(), key.end(), key.begin(),
                         [](char ch) { return (ch >= 'A' && ch <= 'Z') ? ch - 'A' + 'a' : ch; });
          key.push_back('|');
          key.append(std::to_string(hp.port));
          for (const auto& [other, where] : seen)
            if (other == key)
              fail(ip, "duplicate address " + show(list[i]) + " (already " + where + ")");
          seen.emplace_back(key, ip);
          addresses.push_back(s);
        }
      });
  });
  r.with("hosts", [&](const json& v, const std::string& p) {
    if (!v.is_object())
      expected(p, "an object of \"job:index\" -> {\"replicas\", \"devices\", \"shards\"}", v);
    for (const auto& [key, e] : v.items()) {
      object_reader h(e, join(p, key), {"replicas", "devices", "shards"});
      task_hosts th;
      h.with("replicas",
             [&](const json& l, const std::string& lp) { th.replicas = read_index_list(l, lp); });
      h.with("shards",
             [&](const json& l, const std::string& lp) { th.shards = read_index_list(l, lp); });
      h.with("devices", [&](const json& l, const std::string& lp) {
        if (!l.is_array()) expected(lp, "an array of \"cpu:N\" or \"cuda:N\" strings", l);
        for (std::size_t i = 0; i < l.size(); ++i) {
          if (!l[i].is_string() || !valid_device(l[i].get_ref<const std::string&>()))
            expected(index(lp, i), "\"cpu:N\" or \"cuda:N\"", l[i]);
          th.devices.push_back(l[i].get<std::string>());
        }
      });
      c.hosts[key] = std::move(th);
    }
  });
  r.with("join_timeout_seconds", [&](const json& v, const std::string& p) {
    c.join_timeout_seconds = read_number(v, p, positive);
  });
  r.with("heartbeat_seconds", [&](const json& v, const std::string& p) {
    c.heartbeat_seconds = read_number(v, p, positive);
  });
  r.with("secret_env",
         [&](const json& v, const std::string& p) { c.secret_env = read_env_name(v, p); });
  r.with("secret_file",
         [&](const json& v, const std::string& p) { c.secret_file = read_string(v, p, false); });
}

// Rules that involve more than one field; run after every field is valid.
// What a job on a discrete device (cuda:N, sim:N: memory of its own) cannot
// do yet, and what the device all-reduce (reducer "nccl") needs. (mirrored's
// sharded update, strategy.shard_optimizer, is a CPU feature: on these
// devices every replica applies the whole update, logged.)
void check_device_rules(const job_config& c, const strategy_rules* rules) {
  auto kind_of = [](const std::string& d) { return d.substr(0, d.find(':')); };
  std::string discrete;
  bool mixed = false;
  for (const auto& d : c.devices) {
    if (kind_of(d) != "cpu" && discrete.empty()) discrete = d;
    if (kind_of(d) != kind_of(c.devices.front())) mixed = true;
  }
  if (!discrete.empty()) {
    if (rules && !rules->trains_classifier())
      fail("devices", "the " + c.strategy.kind + " strategy runs on cpu:N devices only, got " +
                          show(json(discrete)));
  }
  if (c.strategy.reducer.algorithm != "nccl") return;
  if (c.strategy.kind != "mirrored")
    fail("strategy.reducer.algorithm",
         "\"nccl\" is the mirrored strategy's device all-reduce; strategy.kind is " +
             show(json(c.strategy.kind)));
  if (mixed)
    fail("devices", "the nccl all-reduce needs devices of one kind, got " + show(json(c.devices)));
  if (!c.cluster && c.strategy.replicas > static_cast<int64_t>(c.devices.size()))
    fail("strategy.replicas", "the nccl all-reduce needs one device per replica: " +
                                  std::to_string(c.strategy.replicas) + " replicas on " +
                                  std::to_string(c.devices.size()) + " devices");
}

// The strategy's own rules are its file's (strategies/<kind>.cpp).
void check_cross_fields(const job_config& c) {
  auto rules = find_strategy_rules(c.strategy.kind);
  if (rules && rules->trains_classifier()) {
    // Any classifier model: "mlp" or one a program registered (register_model).
    if (c.model.kind == "policy_value_mlp")
      fail("model.kind", "the " + c.strategy.kind +
                             " strategy trains a classifier: expected \"mlp\" or a registered "
                             "classifier model, got " +
                             show(json(c.model.kind)));
    if (c.rl_given)
      fail("rl", "only the actor_learner strategy reads this section (strategy.kind is " +
                     show(json(c.strategy.kind)) + ")");
  }
  check_device_rules(c, rules.get());
  if (rules) rules->validate(c);
  if (c.strategy.partitioner.kind == "min_max_bytes" && c.strategy.partitioner.max_shard_bytes <= 0)
    fail("strategy.partitioner.max_shard_bytes",
         "the min_max_bytes partitioner needs a size > 0 to split at, got " +
             std::to_string(c.strategy.partitioner.max_shard_bytes));
  const auto& s = c.optimizer.schedule;
  if (s.kind == "cosine" && s.min_lr > c.optimizer.learning_rate)
    fail("optimizer.schedule.min_lr", "expected a number <= optimizer.learning_rate (" +
                                          json(c.optimizer.learning_rate).dump() + "), got " +
                                          json(s.min_lr).dump());
}

// "replicas": "auto" takes every device, as tf.distribute's MirroredStrategy
// does by default: the listed devices, else one CPU device per usable core.
// one_device always has one replica. The global batch caps the count (every
// replica needs an example), and a cluster spec needs an explicit count: each
// process would resolve "auto" on its own machine, and they must agree.
void resolve_auto_replicas(job_config& c, bool devices_given) {
  if (!c.strategy.replicas_auto) return;
  if (c.cluster)
    fail("strategy.replicas",
         "\"auto\" is for a job in one process; a cluster spec needs an explicit count "
         "that every process agrees on");
  if (c.strategy.kind == "one_device") {
    c.strategy.replicas = 1;
    return;
  }
  int64_t n = devices_given ? static_cast<int64_t>(c.devices.size()) : usable_cpu_cores();
  n = std::clamp<int64_t>(n, 1, std::min<int64_t>(65536, c.data.batch_size));
  c.strategy.replicas = n;
  if (!devices_given) {
    c.devices.clear();
    for (int64_t i = 0; i < n; ++i) c.devices.push_back("cpu:" + std::to_string(i));
  }
}

}  // namespace

namespace {
struct model_kinds {
  std::mutex mu;
  std::vector<std::string> names{"mlp", "policy_value_mlp"};
};
model_kinds& the_model_kinds() {
  static model_kinds k;
  return k;
}
}  // namespace

void register_model_kind(const std::string& kind) {
  auto& k = the_model_kinds();
  std::lock_guard<std::mutex> g(k.mu);
  if (std::find(k.names.begin(), k.names.end(), kind) == k.names.end()) k.names.push_back(kind);
}

std::vector<std::string> known_model_kinds() {
  auto& k = the_model_kinds();
  std::lock_guard<std::mutex> g(k.mu);
  return k.names;
}

int64_t usable_cpu_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

job_config parse_job_config(const nlohmann::json& j) {
  job_config c;
  object_reader r(j, "",
                  {"name", "seed", "model", "optimizer", "data", "strategy", "devices", "training",
                   "rl", "checkpoint", "logging", "cluster"});
  r.with("name", [&](const json& v, const std::string& p) { c.name = read_name(v, p); });
  r.with("seed", [&](const json& v, const std::string& p) { c.seed = read_uint(v, p); });
  r.with("model", [&](const json& v, const std::string& p) { read_model(v, p, c.model); });
  r.with("optimizer",
         [&](const json& v, const std::string& p) { read_optimizer(v, p, c.optimizer); });
  r.with("data", [&](const json& v, const std::string& p) { read_data(v, p, c.data); });
  r.with("strategy", [&](const json& v, const std::string& p) { read_strategy(v, p, c.strategy); });
  bool devices_given = false;
  r.with("devices", [&](const json& v, const std::string& p) {
    c.devices = read_devices(v, p);
    devices_given = true;
  });
  r.with("training", [&](const json& v, const std::string& p) { read_training(v, p, c.training); });
  r.with("rl", [&](const json& v, const std::string& p) {
    c.rl_given = true;
    read_rl(v, p, c.rl);
  });
  r.with("checkpoint",
         [&](const json& v, const std::string& p) { read_checkpoint(v, p, c.checkpoint); });
  r.with("logging", [&](const json& v, const std::string& p) { read_logging(v, p, c.logging); });
  r.with("cluster", [&](const json& v, const std::string& p) {
    c.cluster.emplace();
    read_cluster(v, p, *c.cluster);
  });
  resolve_auto_replicas(c, devices_given);
  check_cross_fields(c);
  check_cluster(c);
  return c;
}

nlohmann::json to_json(const job_config& c) {
  const auto& m = c.model;
  const auto& o = c.optimizer;
  const auto& s = o.schedule;
  const auto& d = c.data;
  json j = json::object();
  j["name"] = c.name;
  j["seed"] = c.seed;
  j["model"] = {
      {"kind", m.kind}, {"hidden", m.hidden}, {"activation", m.activation}, {"init", m.init}};
  j["optimizer"] = {{"kind", o.kind},
                    {"learning_rate", o.learning_rate},
                    {"momentum", o.momentum},
                    {"nesterov", o.nesterov},
                    {"beta1", o.beta1},
                    {"beta2", o.beta2},
                    {"epsilon", o.epsilon},
                    {"rho", o.rho},
                    {"weight_decay", o.weight_decay},
                    {"decoupled_weight_decay", o.decoupled_weight_decay},
                    {"schedule",
                     {{"kind", s.kind},
                      {"warmup_steps", s.warmup_steps},
                      {"step_size", s.step_size},
                      {"gamma", s.gamma},
                      {"decay_steps", s.decay_steps},
                      {"min_lr", s.min_lr}}}};
  j["data"] = {{"dataset", d.dataset},       {"path", d.path},
               {"batch_size", d.batch_size}, {"shuffle", d.shuffle},
               {"normalize", d.normalize},   {"prefetch", d.prefetch},
               {"gather", d.gather},         {"train_limit", d.train_limit},
               {"test_limit", d.test_limit}};
  j["strategy"] = {{"kind", c.strategy.kind},
                   {"replicas", c.strategy.replicas},
                   {"steps_per_update", c.strategy.steps_per_update},
                   {"reducer",
                    {{"algorithm", c.strategy.reducer.algorithm},
                     {"bucket_bytes", c.strategy.reducer.bucket_bytes},
                     {"chunk_bytes", c.strategy.reducer.chunk_bytes},
                     {"hierarchical", c.strategy.reducer.hierarchical}}},
                   {"shard_optimizer", c.strategy.shard_optimizer},
                   {"shards", c.strategy.shards},
                   {"partitioner",
                    {{"kind", c.strategy.partitioner.kind},
                     {"max_shard_bytes", c.strategy.partitioner.max_shard_bytes},
                     {"min_slice_bytes", c.strategy.partitioner.min_slice_bytes},
                     {"fixed_shards", c.strategy.partitioner.fixed_shards}}},
                   {"max_staleness", c.strategy.max_staleness},
                   {"communication_period", c.strategy.communication_period},
                   {"moving_rate", c.strategy.moving_rate},
                   {"rho", c.strategy.rho},
                   {"synchronous", c.strategy.synchronous},
                   {"check_replicas_every", c.strategy.check_replicas_every}};
  j["devices"] = c.devices;
  j["training"] = {{"epochs", c.training.epochs},
                   {"max_steps", c.training.max_steps},
                   {"eval_every_epochs", c.training.eval_every_epochs},
                   {"max_env_steps", c.training.max_env_steps}};
  if (c.training.target_return) j["training"]["target_return"] = *c.training.target_return;
  if (c.rl_given || c.strategy.kind == "actor_learner") {
    const auto& rl = c.rl;
    j["rl"] = {{"env", rl.env},
               {"actors", rl.actors},
               {"envs_per_actor", rl.envs_per_actor},
               {"unroll_length", rl.unroll_length},
               {"batch_unrolls", rl.batch_unrolls},
               {"discount", rl.discount},
               {"reward_scale", rl.reward_scale},
               {"rho_bar", rl.rho_bar},
               {"c_bar", rl.c_bar},
               {"baseline_cost", rl.baseline_cost},
               {"entropy_cost", rl.entropy_cost},
               {"grad_clip", rl.grad_clip},
               {"learners", rl.learners},
               {"weights_every", rl.weights_every},
               {"max_policy_lag", rl.max_policy_lag},
               {"queue_capacity", rl.queue_capacity}};
  }
  j["checkpoint"] = {{"dir", c.checkpoint.dir},
                     {"every_steps", c.checkpoint.every_steps},
                     {"keep", c.checkpoint.keep},
                     {"save_at_end", c.checkpoint.save_at_end},
                     {"save_local_copies", c.checkpoint.save_local_copies}};
  j["logging"] = {{"level", c.logging.level},
                  {"every_steps", c.logging.every_steps},
                  {"output_dir", c.logging.output_dir}};
  if (c.cluster) {
    const auto& k = *c.cluster;
    json hosts = json::object();
    for (const auto& [name, h] : k.hosts) {
      json e = {{"replicas", h.replicas}, {"shards", h.shards}};
      if (!h.devices.empty()) e["devices"] = h.devices;
      hosts[name] = std::move(e);
    }
    j["cluster"] = {{"tasks", k.tasks},
                    {"hosts", std::move(hosts)},
                    {"join_timeout_seconds", k.join_timeout_seconds},
                    {"heartbeat_seconds", k.heartbeat_seconds},
                    {"secret_env", k.secret_env},
                    {"secret_file", k.secret_file}};
  }
  return j;
}

}  // namespace troupe
