// rl's part of the schema (config/rl_schema.hpp): the environment (a
// built-in name, a Gymnasium env, a plugin), Ape-X's replay, central
// inference and the learner's keys, their checks and their effective JSON.
#include "config/rl_schema.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/cluster_schema.hpp"
#include "config/json_read.hpp"
#include "config/population_schema.hpp"

namespace troupe {
namespace {

using nlohmann::json;
using namespace json_read;

// rl.env.wrappers: each "name", "name:arg" or {"name": ..., "kwargs": {...}};
// whether the name is a wrapper the worker knows is found when it starts.
std::string read_wrappers(const json& v, const std::string& p) {
  if (!v.is_array()) expected(p, "an array of wrapper names (\"frame_stack:4\") or objects", v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& w = v[i];
    const auto at = index(p, i);
    if (w.is_string()) {
      read_string(w, at, true);
      continue;
    }
    if (!w.is_object()) expected(at, "a wrapper's name or {\"name\": ..., \"kwargs\": {...}}", w);
    object_reader r(w, at, {"name", "kwargs"});
    if (!r.get("name")) throw config_error(at + ".name", "missing: expected a wrapper's name");
    r.with("name", [&](const json& n, const std::string& np) { read_string(n, np, true); });
    r.with("kwargs", [&](const json& k, const std::string& kp) {
      if (!k.is_object()) expected(kp, "an object (the wrapper's keyword arguments)", k);
    });
  }
  return v.dump();
}

// Whether the id, the class and the spaces work is found by starting the
// environment (the strategy's validation): here only the shape.
gymnasium_env_config read_gymnasium_env(const json& j, const std::string& path) {
  object_reader r(j, path, {"kind", "id", "kwargs", "entry_point", "python", "wrappers"});
  gymnasium_env_config g;
  std::string kind;
  r.with("kind",
         [&](const json& v, const std::string& p) { kind = read_enum(v, p, {"gymnasium"}); });
  r.with("id", [&](const json& v, const std::string& p) { g.id = read_string(v, p, true); });
  r.with("kwargs", [&](const json& v, const std::string& p) {
    if (!v.is_object()) expected(p, "an object (gymnasium.make's keyword arguments)", v);
    g.kwargs = v.dump();
  });
  r.with("entry_point", [&](const json& v, const std::string& p) {
    g.entry_point = read_string(v, p, true);
    if (g.entry_point.find(':') == std::string::npos) expected(p, "\"package.module:Class\"", v);
  });
  r.with("python",
         [&](const json& v, const std::string& p) { g.python = read_string(v, p, true); });
  r.with("wrappers",
         [&](const json& v, const std::string& p) { g.wrappers = read_wrappers(v, p); });
  if (kind.empty()) throw config_error(path + ".kind", "missing: expected \"gymnasium\"");
  if (g.id.empty()) throw config_error(path + ".id", "missing: expected a Gymnasium id");
  return g;
}

json gymnasium_env_to_json(const gymnasium_env_config& g) {
  json j = {
      {"kind", "gymnasium"}, {"id", g.id}, {"kwargs", json::parse(g.kwargs)}, {"python", g.python}};
  if (!g.entry_point.empty()) j["entry_point"] = g.entry_point;
  if (g.wrappers != "[]") j["wrappers"] = json::parse(g.wrappers);
  return j;
}

// Whether the library loads and its spaces fit is found by loading it (the
// strategy's validation): here only the shape.
plugin_env_config read_plugin_env(const json& j, const std::string& path) {
  object_reader r(j, path, {"kind", "library", "id", "kwargs"});
  plugin_env_config g;
  r.with("library",
         [&](const json& v, const std::string& p) { g.library = read_string(v, p, true); });
  r.with("id", [&](const json& v, const std::string& p) { g.id = read_string(v, p, true); });
  r.with("kwargs", [&](const json& v, const std::string& p) {
    if (!v.is_object()) expected(p, "an object (the plugin's keyword arguments)", v);
    g.kwargs = v.dump();
  });
  if (g.library.empty())
    throw config_error(path + ".library", "missing: expected the plugin's shared library (.so)");
  if (g.id.empty())
    throw config_error(path + ".id", "missing: expected the id of an environment the plugin makes");
  return g;
}

json plugin_env_to_json(const plugin_env_config& g) {
  return {
      {"kind", "plugin"}, {"library", g.library}, {"id", g.id}, {"kwargs", json::parse(g.kwargs)}};
}

json env_to_json(const rl_config& rl) {
  if (rl.gymnasium) return gymnasium_env_to_json(*rl.gymnasium);
  if (rl.plugin) return plugin_env_to_json(*rl.plugin);
  return rl.env;
}

// rl.env as an object: {"kind": "gymnasium"} or {"kind": "plugin"}.
void read_env_object(const json& v, const std::string& p, rl_config& c) {
  const auto kind = v.find("kind");
  if (kind == v.end())
    throw config_error(p + ".kind", R"(missing: expected "gymnasium" or "plugin")");
  const auto k = read_enum(*kind, p + ".kind", {"gymnasium", "plugin"});
  c.gymnasium.reset();
  c.plugin.reset();
  if (k == "plugin") {
    c.plugin = read_plugin_env(v, p);
    c.env = c.plugin->id;
    return;
  }
  c.gymnasium = read_gymnasium_env(v, p);
  c.env = c.gymnasium->id;
}

void read_replay(const json& j, const std::string& path, replay_config& c) {
  object_reader r(j, path,
                  {"shards", "capacity", "alpha", "beta", "n_step", "min_size", "batch_size",
                   "target_every", "samples_per_insert", "epsilon", "epsilon_alpha"});
  r.with("shards",
         [&](const json& v, const std::string& p) { c.shards = read_int_in(v, p, 1, 4096); });
  r.with("capacity", [&](const json& v, const std::string& p) {
    c.capacity = read_int_in(v, p, 1, int64_t{1} << 30);
  });
  r.with("alpha",
         [&](const json& v, const std::string& p) { c.alpha = read_number(v, p, non_negative); });
  r.with("beta", [&](const json& v, const std::string& p) {
    c.beta = read_number(v, p, range{0, false, true, 1, false});
  });
  r.with("n_step",
         [&](const json& v, const std::string& p) { c.n_step = read_int_in(v, p, 1, 1000); });
  r.with("min_size", [&](const json& v, const std::string& p) {
    c.min_size = read_int_in(v, p, 1, int64_t{1} << 30);
  });
  r.with("batch_size", [&](const json& v, const std::string& p) {
    c.batch_size = read_int_in(v, p, 1, 1 << 20);
  });
  r.with("target_every",
         [&](const json& v, const std::string& p) { c.target_every = read_int(v, p, 1); });
  r.with("samples_per_insert", [&](const json& v, const std::string& p) {
    c.samples_per_insert = read_number(v, p, range{0, false, true, 1e6, false});
  });
  r.with("epsilon", [&](const json& v, const std::string& p) {
    c.epsilon = read_number(v, p, range{0, false, true, 1, false});
  });
  r.with("epsilon_alpha", [&](const json& v, const std::string& p) {
    c.epsilon_alpha = read_number(v, p, non_negative);
  });
}

void read_central(const json& j, const std::string& path, central_inference_config& c) {
  object_reader r(j, path, {"max_batch", "max_wait_us", "yield_us", "device"});
  r.with("max_batch",
         [&](const json& v, const std::string& p) { c.max_batch = read_int_in(v, p, 1, 1 << 24); });
  r.with("max_wait_us", [&](const json& v, const std::string& p) {
    c.max_wait_us = read_int_in(v, p, 0, 10000000);
  });
  r.with("yield_us",
         [&](const json& v, const std::string& p) { c.yield_us = read_int_in(v, p, 0, 100000); });
  r.with("device", [&](const json& v, const std::string& p) {
    if (!v.is_string() || (!v.get_ref<const std::string&>().empty() &&
                           !valid_device(v.get_ref<const std::string&>())))
      expected(p, "\"\" (the host), \"cpu:N\", \"sim:N\" or \"cuda:N\"", v);
    c.device = v.get<std::string>();
  });
}

}  // namespace

void read_rl(const json& j, const std::string& path, rl_config& c) {
  object_reader r(j, path, {"algorithm",     "replay",          "env",
                            "actors",        "envs_per_actor",  "unroll_length",
                            "batch_unrolls", "discount",        "reward_scale",
                            "rho_bar",       "c_bar",           "baseline_cost",
                            "entropy_cost",  "grad_clip",       "learners",
                            "weights_every", "max_policy_lag",  "queue_capacity",
                            "policy_head",   "initial_log_std", "normalize_advantages",
                            "inference",     "central",         "population",
                            "torso"});
  r.with("algorithm", [&](const json& v, const std::string& p) {
    c.algorithm = read_enum(v, p, {"impala", "apex_dqn"});
  });
  r.with("replay", [&](const json& v, const std::string& p) { read_replay(v, p, c.replay); });
  // The environment's name is checked against the registry by the strategy.
  r.with("env", [&](const json& v, const std::string& p) {
    if (!v.is_object()) {
      c.env = read_string(v, p, true);
      c.gymnasium.reset();
      c.plugin.reset();
      return;
    }
    read_env_object(v, p, c);
  });
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
  // Whether the head fits the environment is checked by the strategy.
  r.with("policy_head", [&](const json& v, const std::string& p) {
    c.policy_head = read_enum(v, p, {"auto", "softmax", "gaussian"});
  });
  r.with("torso", [&](const json& v, const std::string& p) {
    c.torso = read_enum(v, p, {"auto", "mlp", "nature_cnn"});
  });
  r.with("initial_log_std", [&](const json& v, const std::string& p) {
    c.initial_log_std = read_number(v, p, range{-10, false, true, 2, false});
  });
  r.with("normalize_advantages",
         [&](const json& v, const std::string& p) { c.normalize_advantages = read_bool(v, p); });
  r.with("learners",
         [&](const json& v, const std::string& p) { c.learners = read_int_in(v, p, 1, 4096); });
  r.with("weights_every",
         [&](const json& v, const std::string& p) { c.weights_every = read_int(v, p, 1); });
  r.with("max_policy_lag",
         [&](const json& v, const std::string& p) { c.max_policy_lag = read_int(v, p, -1); });
  r.with("queue_capacity", [&](const json& v, const std::string& p) {
    c.queue_capacity = read_int_in(v, p, 1, 65536);
  });
  // Which combinations central inference takes is checked by the strategy.
  r.with("inference", [&](const json& v, const std::string& p) {
    c.inference = read_enum(v, p, {"local", "central"});
  });
  r.with("central", [&](const json& v, const std::string& p) { read_central(v, p, c.central); });
  r.with("population",
         [&](const json& v, const std::string& p) { read_population(v, p, c.population); });
}

json rl_to_json(const rl_config& rl) {
  const auto& rp = rl.replay;
  json j = {{"algorithm", rl.algorithm},
            {"replay",
             {{"shards", rp.shards},
              {"capacity", rp.capacity},
              {"alpha", rp.alpha},
              {"beta", rp.beta},
              {"n_step", rp.n_step},
              {"min_size", rp.min_size},
              {"batch_size", rp.batch_size},
              {"target_every", rp.target_every},
              {"samples_per_insert", rp.samples_per_insert},
              {"epsilon", rp.epsilon},
              {"epsilon_alpha", rp.epsilon_alpha}}},
            {"env", env_to_json(rl)},
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
            {"policy_head", rl.policy_head},
            {"initial_log_std", rl.initial_log_std},
            {"torso", rl.torso},
            {"normalize_advantages", rl.normalize_advantages},
            {"grad_clip", rl.grad_clip},
            {"learners", rl.learners},
            {"weights_every", rl.weights_every},
            {"max_policy_lag", rl.max_policy_lag},
            {"queue_capacity", rl.queue_capacity},
            {"inference", rl.inference},
            {"central",
             {{"max_batch", rl.central.max_batch},
              {"max_wait_us", rl.central.max_wait_us},
              {"yield_us", rl.central.yield_us},
              {"device", rl.central.device}}}};
  if (rl.population.size > 0) j["population"] = population_to_json(rl.population);
  return j;
}

}  // namespace troupe
