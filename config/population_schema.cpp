#include "config/population_schema.hpp"

#include <algorithm>
#include <vector>

#include "config/json_read.hpp"

namespace troupe {
namespace {

using nlohmann::json;
using namespace json_read;

// A hyperparameter's start: a number (every member starts there), an array
// of one value per member, or {"sampling": "uniform" | "log_uniform",
// "min", "max"}.
void read_hyperparameter(const json& v, const std::string& path, population_hyperparameter& h) {
  if (v.is_number()) {
    h.sampling = "values";
    h.values = {read_number(v, path, positive)};
    h.min = h.max = h.values.front();
    return;
  }
  if (v.is_array()) {
    if (v.empty()) expected(path, "one positive number per member", v);
    h.sampling = "values";
    h.values.clear();
    for (std::size_t i = 0; i < v.size(); ++i)
      h.values.push_back(read_number(v[i], index(path, i), positive));
    h.min = *std::min_element(h.values.begin(), h.values.end());
    h.max = *std::max_element(h.values.begin(), h.values.end());
    return;
  }
  object_reader r(v, path, {"sampling", "min", "max"});
  h.values.clear();
  h.sampling = "log_uniform";
  r.with("sampling", [&](const json& x, const std::string& p) {
    h.sampling = read_enum(x, p, {"uniform", "log_uniform"});
  });
  for (const char* bound : {"min", "max"})
    if (!r.get(bound))
      throw config_error(r.path(bound), "missing: expected the range's " + std::string(bound) +
                                            " (a positive number)");
  h.min = read_number(*r.get("min"), r.path("min"), positive);
  h.max = read_number(*r.get("max"), r.path("max"), positive);
  if (h.max < h.min) expected(r.path("max"), "at least min (" + json(h.min).dump() + ")", v["max"]);
}

void read_explore(const json& j, const std::string& path, population_config& c) {
  object_reader r(j, path, {"factors", "resample_probability"});
  r.with("factors", [&](const json& v, const std::string& p) {
    if (!v.is_array() || v.empty()) expected(p, "an array of positive factors", v);
    c.factors.clear();
    for (std::size_t i = 0; i < v.size(); ++i)
      c.factors.push_back(read_number(v[i], index(p, i), positive));
  });
  r.with("resample_probability", [&](const json& v, const std::string& p) {
    c.resample_probability = read_number(v, p, unit_closed);
  });
}

void read_exploit(const json& j, const std::string& path, population_config& c) {
  object_reader r(j, path, {"quantile"});
  r.with("quantile", [&](const json& v, const std::string& p) {
    c.quantile = read_number(v, p, range{0, true, true, 0.5, false});
  });
}

// "values" need one per member (a single number serves every member).
void check_values(const population_hyperparameter& h, const std::string& path, int64_t size) {
  if (h.sampling != "values" || h.values.size() <= 1) return;
  if (static_cast<int64_t>(h.values.size()) != size)
    throw config_error(path, "expected one value per member (rl.population.size " +
                                 std::to_string(size) + "), got " +
                                 std::to_string(h.values.size()));
}

json hyperparameter_to_json(const population_hyperparameter& h) {
  if (h.sampling == "job") return nullptr;
  if (h.sampling == "values") return h.values.size() == 1 ? json(h.values.front()) : json(h.values);
  return {{"sampling", h.sampling}, {"min", h.min}, {"max", h.max}};
}

}  // namespace

void read_population(const json& j, const std::string& path, population_config& c) {
  object_reader r(
      j, path,
      {"size", "interval_env_steps", "learning_rate", "entropy_cost", "exploit", "explore"});
  if (!r.get("size"))
    throw config_error(r.path("size"), "missing: expected the number of members (at least 2)");
  c.size = read_int(*r.get("size"), r.path("size"), 2);
  if (c.size > 1024) expected(r.path("size"), "an integer >= 2 (at most 1024)", *r.get("size"));
  r.with("interval_env_steps",
         [&](const json& v, const std::string& p) { c.interval_env_steps = read_int(v, p, 1); });
  r.with("learning_rate",
         [&](const json& v, const std::string& p) { read_hyperparameter(v, p, c.learning_rate); });
  r.with("entropy_cost",
         [&](const json& v, const std::string& p) { read_hyperparameter(v, p, c.entropy_cost); });
  r.with("exploit", [&](const json& v, const std::string& p) { read_exploit(v, p, c); });
  r.with("explore", [&](const json& v, const std::string& p) { read_explore(v, p, c); });
  check_values(c.learning_rate, r.path("learning_rate"), c.size);
  check_values(c.entropy_cost, r.path("entropy_cost"), c.size);
}

json population_to_json(const population_config& c) {
  json j = {
      {"size", c.size},
      {"interval_env_steps", c.interval_env_steps},
      {"exploit", {{"quantile", c.quantile}}},
      {"explore", {{"factors", c.factors}, {"resample_probability", c.resample_probability}}}};
  if (c.learning_rate.sampling != "job")
    j["learning_rate"] = hyperparameter_to_json(c.learning_rate);
  if (c.entropy_cost.sampling != "job") j["entropy_cost"] = hyperparameter_to_json(c.entropy_cost);
  return j;
}

}  // namespace troupe
