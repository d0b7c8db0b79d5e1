// The JSON schema of a job: names, types, ranges, cross-field rules, and the
// error messages a user reads when a config is wrong.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "config/cluster_schema.hpp"
#include "config/job_config.hpp"
#include "config/json_read.hpp"
#include "config/registry.hpp"
#include "config/rl_schema.hpp"
#include "config/strategy_rules.hpp"

namespace troupe {
namespace {

using nlohmann::json;
using namespace json_read;

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
  object_reader r(j, path, {"kind", "hidden", "activation", "init", "layers", "loss"});
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
  // The layers' own keys and shapes are the model's to check, against the
  // data (models/layer_model.hpp: check_layer_model).
  r.with("layers", [&](const json& v, const std::string& p) {
    if (!v.is_array() || v.empty()) expected(p, "a non-empty array of layer objects", v);
    m.layers = v;
  });
  r.with("loss", [&](const json& v, const std::string& p) {
    m.loss = read_enum(v, p, {"softmax_cross_entropy", "binary_cross_entropy", "mse"});
  });
  // "layers" (a classifier or regressor) and "policy_value_layers" (the
  // actor/learner's torso) are made of layers.
  const bool of_layers = m.kind == "layers" || m.kind == "policy_value_layers";
  if (of_layers && m.layers.is_null())
    fail(r.path("layers"), "missing: model.kind \"" + m.kind + "\" needs its layers");
  if (!of_layers && !m.layers.is_null())
    fail(r.path("layers"),
         "only model.kind \"layers\" or \"policy_value_layers\" takes layers "
         "(got kind \"" +
             m.kind + "\")");
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

const std::vector<std::string> kDataFormats = {"idx", "npy", "npz", "csv"};

// data.train / data.test: an object {"x", "y"} of .npy files (npy), else a
// file (npz, csv).
data_split_files read_split_files(const json& v, const std::string& path,
                                  const std::string& format) {
  data_split_files f;
  if (format != "npy") {
    f.file = read_string(v, path, true);
    return f;
  }
  if (!v.is_object())
    expected(path, "an object {\"x\": \"x.npy\", \"y\": \"y.npy\"} (the npy format)", v);
  object_reader r(v, path, {"x", "y"});
  for (const char* key : {"x", "y"})
    if (!r.get(key))
      fail(r.path(key),
           "missing; the npy format reads the examples (x) and the labels (y) "
           "from two .npy files");
  r.with("x", [&](const json& e, const std::string& p) { f.x = read_string(e, p, true); });
  r.with("y", [&](const json& e, const std::string& p) { f.y = read_string(e, p, true); });
  return f;
}

void read_data(const json& j, const std::string& path, data_config& d) {
  object_reader r(j, path,
                  {"format", "dataset", "path", "train", "test", "x_key", "y_key", "label",
                   "classes", "standardize", "batch_size", "shuffle", "normalize", "prefetch",
                   "gather", "placement", "train_limit", "test_limit"});
  r.with("format",
         [&](const json& v, const std::string& p) { d.format = read_enum(v, p, kDataFormats); });
  // Each format's own keys: a key of another format is named as such, not
  // ignored (a "path" beside "format": "npy" would otherwise look used).
  const std::vector<std::pair<std::string, std::vector<std::string>>> owners = {
      {"dataset", {"idx"}},
      {"path", {"idx"}},
      {"train", {"npy", "npz", "csv"}},
      {"test", {"npy", "npz", "csv"}},
      {"x_key", {"npz"}},
      {"y_key", {"npz"}},
      {"label", {"csv"}}};
  for (const auto& [key, formats] : owners) {
    const bool mine = std::find(formats.begin(), formats.end(), d.format) != formats.end();
    if (!mine && r.get(key))
      fail(r.path(key), "only the " + quoted_list(formats) + " format" +
                            (formats.size() > 1 ? "s read" : " reads") +
                            " this key (data.format is " + show(json(d.format)) + ")");
    const bool required = key == "train" || key == "test" || key == "label";
    if (mine && required && !r.get(key))
      fail(r.path(key),
           "missing; the " + d.format + " format needs it (" +
               (key == "label"      ? std::string("the name of the label column")
                : d.format == "npy" ? "{\"x\": \"x_" + key + ".npy\", \"y\": \"y_" + key + ".npy\"}"
                                    : "\"" + key + "." + d.format + "\"") +
               ")");
  }
  r.with("dataset", [&](const json& v, const std::string& p) {
    d.dataset = read_enum(v, p, {"fashion_mnist"});
  });
  r.with("path", [&](const json& v, const std::string& p) { d.path = read_string(v, p, true); });
  r.with("train",
         [&](const json& v, const std::string& p) { d.train = read_split_files(v, p, d.format); });
  r.with("test",
         [&](const json& v, const std::string& p) { d.test = read_split_files(v, p, d.format); });
  r.with("x_key", [&](const json& v, const std::string& p) { d.x_key = read_string(v, p, true); });
  r.with("y_key", [&](const json& v, const std::string& p) { d.y_key = read_string(v, p, true); });
  if (d.format == "npz" && d.x_key == d.y_key)
    fail(r.path(r.get("y_key") ? "y_key" : "x_key"),
         "the examples and the labels must be different arrays, both are " + show(json(d.x_key)));
  r.with("label", [&](const json& v, const std::string& p) { d.label = read_string(v, p, true); });
  // Bounded: the model allocates an output per class.
  r.with("classes",
         [&](const json& v, const std::string& p) { d.classes = read_int_in(v, p, 1, 1 << 24); });
  r.with("standardize",
         [&](const json& v, const std::string& p) { d.standardize = read_bool(v, p); });
  r.with("batch_size",
         [&](const json& v, const std::string& p) { d.batch_size = read_int(v, p, 1); });
  r.with("shuffle", [&](const json& v, const std::string& p) { d.shuffle = read_bool(v, p); });
  r.with("normalize", [&](const json& v, const std::string& p) { d.normalize = read_bool(v, p); });
  r.with("prefetch",
         [&](const json& v, const std::string& p) { d.prefetch = read_int_in(v, p, 1, 1024); });
  r.with("placement", [&](const json& v, const std::string& p) {
    d.placement = read_enum(v, p, {"auto", "device", "host"});
  });
  r.with("gather", [&](const json& v, const std::string& p) {
    d.gather = read_enum(v, p, {"auto", "pipeline", "device", "step"});
  });
  r.with("train_limit",
         [&](const json& v, const std::string& p) { d.train_limit = read_int(v, p, 0); });
  r.with("test_limit",
         [&](const json& v, const std::string& p) { d.test_limit = read_int(v, p, 0); });
}

// The effective data section: the keys of data.format, defaults included
// (a key of another format would be refused when the config is read back).
json data_to_json(const data_config& d) {
  json j = {{"format", d.format}};
  if (d.format == "idx") {
    j["dataset"] = d.dataset;
    j["path"] = d.path;
  } else {
    auto split = [&](const data_split_files& f) {
      return d.format == "npy" ? json{{"x", f.x}, {"y", f.y}} : json(f.file);
    };
    j["train"] = split(d.train);
    j["test"] = split(d.test);
  }
  if (d.format == "npz") {
    j["x_key"] = d.x_key;
    j["y_key"] = d.y_key;
  }
  if (d.format == "csv") j["label"] = d.label;
  if (d.classes > 0) j["classes"] = d.classes;
  j["standardize"] = d.standardize;
  j["batch_size"] = d.batch_size;
  j["shuffle"] = d.shuffle;
  j["normalize"] = d.normalize;
  j["prefetch"] = d.prefetch;
  j["gather"] = d.gather;
  j["placement"] = d.placement;
  j["train_limit"] = d.train_limit;
  j["test_limit"] = d.test_limit;
  return j;
}

// strategy.kind, then the keys that strategy lists (strategy_rules::keys()):
// the schema knows no strategy's keys.
void read_strategy(const json& j, const std::string& path, strategy_config& s) {
  if (!j.is_object()) fail(path, std::string("expected a JSON object, got ") + j.type_name());
  if (auto kind = j.find("kind"); kind != j.end())
    s.kind = read_enum(*kind, join(path, "kind"), registered_strategies());
  auto rules = find_strategy_rules(s.kind);
  const auto keys = rules ? rules->keys() : std::vector<strategy_key>{};
  std::vector<std::string> names = {"kind"};
  for (const auto& k : keys) names.push_back(k.name);
  // A key of other strategies: name them, rather than "unknown key".
  for (const auto& [key, value] : j.items()) {
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    auto owners = strategies_with_key(key);
    if (!owners.empty())
      fail(join(path, key), "the " + s.kind + " strategy does not use this key (a key of " +
                                quoted_list(owners) + ")");
  }
  object_reader r(j, path, names);
  for (const auto& k : keys)
    r.with(k.name, [&](const json& v, const std::string& p) { k.read(v, p, s); });
}

// The effective strategy section: kind and the value of every key the
// strategy lists, defaults included.
json strategy_to_json(const strategy_config& s) {
  json j = {{"kind", s.kind}};
  if (auto rules = find_strategy_rules(s.kind))
    for (const auto& k : rules->keys()) j[k.name] = k.write(s);
  return j;
}

// "cpu:N" or "cuda:N", N a decimal index without sign or leading zeros.

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
                  {"epochs", "max_steps", "steps_per_execution", "step_graphs", "tf32",
                   "eval_every_epochs", "max_env_steps", "target_return"});
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
  r.with("step_graphs", [&](const json& v, const std::string& p) {
    t.step_graphs = read_enum(v, p, {"auto", "off"});
  });
  r.with("tf32", [&](const json& v, const std::string& p) {
    t.tf32 = read_enum(v, p, {"convolutions", "all", "off"});
  });
  r.with("steps_per_execution", [&](const json& v, const std::string& p) {
    if (v == "auto") {
      t.steps_per_execution = training_config::kAutoSteps;
      return;
    }
    const auto most = training_config::kMaxStepsPerExecution;
    const std::string want = "an integer in [1, " + std::to_string(most) + "] or \"auto\"";
    if (!v.is_number()) expected(p, want, v);
    const double d = v.get<double>();  // exact for the integers in range
    if (!(d >= 1 && d <= static_cast<double>(most)) || std::floor(d) != d) expected(p, want, v);
    t.steps_per_execution = static_cast<int64_t>(d);
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

int64_t read_metrics_port(const json& v, const std::string& path) {
  if (v == "auto") return logging_config::kMetricsPortAuto;
  const std::string want = "an integer in 0..65535 (0: off) or \"auto\" (a free port)";
  if (!v.is_number_integer()) expected(path, want, v);
  const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= 65535
                                               : v.get<int64_t>() >= 0 && v.get<int64_t>() <= 65535;
  if (!in_range) expected(path, want, v);
  return v.get<int64_t>();
}

// A numeric address, so that what is exposed is exactly what was written
// (a host name could resolve to a public interface).
std::string read_listen_address(const json& v, const std::string& path) {
  const std::string want = "a numeric IPv4 or IPv6 address such as \"127.0.0.1\"";
  if (!v.is_string()) expected(path, want, v);
  const auto& s = v.get_ref<const std::string&>();
  unsigned char buf[sizeof(in6_addr)];
  if (inet_pton(AF_INET, s.c_str(), buf) != 1 && inet_pton(AF_INET6, s.c_str(), buf) != 1)
    expected(path, want, v);
  return s;
}

void read_logging(const json& j, const std::string& path, logging_config& l) {
  object_reader r(j, path,
                  {"level", "every_steps", "output_dir", "tensorboard", "tensorboard_dir",
                   "metrics_port", "metrics_address"});
  r.with("level", [&](const json& v, const std::string& p) { l.level = read_enum(v, p, kLevels); });
  r.with("every_steps",
         [&](const json& v, const std::string& p) { l.every_steps = read_int(v, p, 1); });
  r.with("output_dir",
         [&](const json& v, const std::string& p) { l.output_dir = read_string(v, p, false); });
  r.with("tensorboard",
         [&](const json& v, const std::string& p) { l.tensorboard = read_bool(v, p); });
  r.with("tensorboard_dir", [&](const json& v, const std::string& p) {
    l.tensorboard_dir = read_string(v, p, false);
  });
  r.with("metrics_port",
         [&](const json& v, const std::string& p) { l.metrics_port = read_metrics_port(v, p); });
  r.with("metrics_address", [&](const json& v, const std::string& p) {
    l.metrics_address = read_listen_address(v, p);
  });
}

// Rules that involve more than one field; run after every field is valid.
// A strategy that computes on the host only runs on cpu:N devices.
void check_device_rules(const job_config& c, const strategy_rules* rules) {
  if (!rules || rules->computes_on_discrete_devices()) return;
  for (const auto& d : c.devices)
    if (!d.starts_with("cpu:"))
      fail("devices",
           "the " + c.strategy.kind + " strategy runs on cpu:N devices only, got " + show(json(d)));
}

// data.placement "device" where it cannot be: a strategy whose steps do not
// run on a resident set, or a device that shares the host's memory.
void check_placement(const job_config& c, const strategy_rules* rules) {
  if (c.data.placement != "device") return;
  if (rules && !rules->runs_on_resident_data())
    fail("data.placement",
         "\"device\" is for the one_device strategy (its steps run on a "
         "device-resident data set); the " +
             c.strategy.kind +
             " strategy gathers on the host: expected "
             "\"host\" or \"auto\"");
  for (const auto& d : c.devices)
    if (d.starts_with("cpu:"))
      fail("data.placement",
           "\"device\" needs a device with memory of its own (sim:N or "
           "cuda:N), got " +
               show(json(d)) + ": on cpu:N the data set is already there");
}

// Whether the strategy trains from environments (the "rl" section), not a
// classifier.
bool trains_from_envs(const std::string& kind) {
  auto rules = find_strategy_rules(kind);
  return rules && !rules->trains_classifier();
}

// "the actor_learner strategy", or "the a or b strategy": those that read
// the "rl" section.
std::string rl_strategies() {
  std::string names;
  for (const auto& kind : registered_strategies())
    if (trains_from_envs(kind)) names += (names.empty() ? "" : " or ") + kind;
  return "the " + names + " strategy";
}

// The strategy's own rules are its file's (strategies/<kind>.cpp).
void check_cross_fields(const job_config& c) {
  auto rules = find_strategy_rules(c.strategy.kind);
  if (rules && rules->trains_classifier()) {
    // Any classifier model: a built-in or one a program registered (register_model).
    auto classifiers = model_kinds_of(model_family::classifier);
    if (std::find(classifiers.begin(), classifiers.end(), c.model.kind) == classifiers.end())
      fail("model.kind", "the " + c.strategy.kind + " strategy trains a classifier: expected " +
                             one_of(classifiers) + ", got " + show(json(c.model.kind)));
    if (c.rl_given)
      fail("rl", "only " + rl_strategies() + " reads this section (strategy.kind is " +
                     show(json(c.strategy.kind)) + ")");
  }
  check_device_rules(c, rules.get());
  if (c.training.steps_per_execution > 1 && rules && !rules->steps_together())
    fail("training.steps_per_execution",
         "the " + c.strategy.kind +
             " strategy's workers do not take every step together; expected 1 (the default), "
             "got " +
             std::to_string(c.training.steps_per_execution));
  check_placement(c, rules.get());
  if (rules) rules->validate(c);
  const auto& s = c.optimizer.schedule;
  if (s.kind == "cosine" && s.min_lr > c.optimizer.learning_rate)
    fail("optimizer.schedule.min_lr", "expected a number <= optimizer.learning_rate (" +
                                          json(c.optimizer.learning_rate).dump() + "), got " +
                                          json(s.min_lr).dump());
}

// "replicas": "auto" takes every device, as tf.distribute's MirroredStrategy
// does by default: the listed devices, else one CPU device per usable core.
// The strategy's max_replicas() and the global batch cap the count (every
// replica needs an example), and a cluster spec needs an explicit count: each
// process would resolve "auto" on its own machine, and they must agree.
void resolve_auto_replicas(job_config& c, bool devices_given) {
  if (!c.strategy.replicas_auto) return;
  if (c.cluster)
    fail("strategy.replicas",
         "\"auto\" is for a job in one process; a cluster spec needs an explicit count "
         "that every process agrees on");
  auto rules = find_strategy_rules(c.strategy.kind);
  const int64_t most = rules ? rules->max_replicas() : 65536;
  int64_t n = devices_given ? static_cast<int64_t>(c.devices.size()) : usable_cpu_cores();
  n = std::clamp<int64_t>(n, 1, std::min<int64_t>(most, c.data.batch_size));
  c.strategy.replicas = n;
  if (!devices_given) {
    c.devices.clear();
    for (int64_t i = 0; i < n; ++i) c.devices.push_back("cpu:" + std::to_string(i));
  }
}

}  // namespace

namespace {
named_registry<std::optional<model_family>>& the_model_kinds() {
  static named_registry<std::optional<model_family>> r{"model kind"};
  return r;
}
}  // namespace

void register_model_kind(const std::string& kind, model_family family) {
  auto& r = the_model_kinds();
  if (r.find(kind) == family) return;
  r.add(kind, family);
}

std::vector<std::string> known_model_kinds() {
  return the_model_kinds().names();
}

std::vector<std::string> model_kinds_of(model_family family) {
  std::vector<std::string> out;
  for (const auto& [kind, f] : the_model_kinds().entries())
    if (f == family) out.push_back(kind);
  return out;
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

namespace {

json optimizer_to_json(const optimizer_config& o) {
  const auto& s = o.schedule;
  return {{"kind", o.kind},
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
}

}  // namespace

nlohmann::json to_json(const job_config& c) {
  const auto& m = c.model;
  const auto& o = c.optimizer;
  json j = json::object();
  j["name"] = c.name;
  j["seed"] = c.seed;
  j["model"] = {
      {"kind", m.kind}, {"hidden", m.hidden}, {"activation", m.activation}, {"init", m.init}};
  if (!m.layers.is_null()) j["model"]["layers"] = m.layers;
  if (m.loss != "softmax_cross_entropy") j["model"]["loss"] = m.loss;
  j["optimizer"] = optimizer_to_json(o);
  j["data"] = data_to_json(c.data);
  j["strategy"] = strategy_to_json(c.strategy);
  j["devices"] = c.devices;
  j["training"] = {
      {"epochs", c.training.epochs},
      {"max_steps", c.training.max_steps},
      {"steps_per_execution", c.training.steps_per_execution == training_config::kAutoSteps
                                  ? json("auto")
                                  : json(c.training.steps_per_execution)},
      {"step_graphs", c.training.step_graphs},
      {"tf32", c.training.tf32},
      {"eval_every_epochs", c.training.eval_every_epochs},
      {"max_env_steps", c.training.max_env_steps}};
  if (c.training.target_return) j["training"]["target_return"] = *c.training.target_return;
  if (c.rl_given || trains_from_envs(c.strategy.kind)) j["rl"] = rl_to_json(c.rl);
  j["checkpoint"] = {{"dir", c.checkpoint.dir},
                     {"every_steps", c.checkpoint.every_steps},
                     {"keep", c.checkpoint.keep},
                     {"save_at_end", c.checkpoint.save_at_end},
                     {"save_local_copies", c.checkpoint.save_local_copies}};
  const auto& l = c.logging;
  j["logging"] = {
      {"level", l.level},
      {"every_steps", l.every_steps},
      {"output_dir", l.output_dir},
      {"tensorboard", l.tensorboard},
      {"tensorboard_dir", l.tensorboard_dir},
      {"metrics_port",
       l.metrics_port == logging_config::kMetricsPortAuto ? json("auto") : json(l.metrics_port)},
      {"metrics_address", l.metrics_address}};
  if (c.cluster) j["cluster"] = cluster_to_json(*c.cluster);
  return j;
}

}  // namespace troupe
