// The configuration reference's keys and defaults, taken from the parser
// itself rather than from a second list that could drift from it:
//
//   config_reference print          every key a job config accepts, with its
//                                   default (a JSON value, or "—" for none)
//   config_reference check FILE.md  fails when FILE's key tables miss a key
//                                   the parser accepts, list one it refuses,
//                                   or give another default
//
// Each JSON object of the schema names its keys in one list (the
// object_reader in config/schema.cpp; a strategy's keys(), in its file), and
// the parser tells that list to anyone who gives the object a key it does not
// know ("unknown key (expected one of: ...)"). So the keys are found by
// asking: one probe per object below. A documented key whose object is not
// probed is reported, so the list of probes cannot fall behind the document
// unnoticed. Defaults are the effective config's (to_json, what `troupe
// validate` prints) under each strategy, data format and a cluster.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/job_config.hpp"
#include "config/strategy_rules.hpp"

namespace {

using nlohmann::json;
using troupe::config_error;

const char* const kProbeKey = "zzzz_no_such_key_zzzz";

// A JSON object of the schema: its path in the reference ("cluster.hosts.<task>"),
// a config around it, and where in that config the object is.
struct probe_site {
  std::string path;
  json base;
  std::vector<std::string> at;
  bool also_a_value = false;  // the key takes a string too (rl.env: a name or an object)
};

std::vector<probe_site> probe_sites() {
  const json mirrored = {{"strategy", {{"kind", "mirrored"}}}};
  const json sharded = {{"strategy", {{"kind", "parameter_server"}}}};
  const json population = {{"rl", {{"population", {{"size", 2}}}}}};
  return {
      {"", json::object(), {}},
      {"model", json::object(), {"model"}},
      {"optimizer", json::object(), {"optimizer"}},
      {"optimizer.schedule", json::object(), {"optimizer", "schedule"}},
      {"data", json::object(), {"data"}},
      {"training", json::object(), {"training"}},
      {"rl", json::object(), {"rl"}},
      // rl.env's keys depend on its kind: one probe of each.
      {"rl.env", {{"rl", {{"env", {{"kind", "gymnasium"}}}}}}, {"rl", "env"}, true},
      {"rl.env", {{"rl", {{"env", {{"kind", "plugin"}}}}}}, {"rl", "env"}, true},
      {"rl.replay", json::object(), {"rl", "replay"}},
      {"rl.central", json::object(), {"rl", "central"}},
      {"rl.population", json::object(), {"rl", "population"}},
      {"rl.population.exploit", population, {"rl", "population", "exploit"}},
      {"rl.population.explore", population, {"rl", "population", "explore"}},
      // A number, an array or a range object: the object's keys.
      {"rl.population.learning_rate", population, {"rl", "population", "learning_rate"}, true},
      {"rl.population.entropy_cost", population, {"rl", "population", "entropy_cost"}, true},
      {"checkpoint", json::object(), {"checkpoint"}},
      {"logging", json::object(), {"logging"}},
      {"cluster", json::object(), {"cluster"}},
      {"cluster.tasks", json::object(), {"cluster", "tasks"}},
      {"cluster.hosts.<task>", json::object(), {"cluster", "hosts", "worker:0"}},
      {"cluster.roles", json::object(), {"cluster", "roles"}},
      {"cluster.tls", json::object(), {"cluster", "tls"}},
      {"strategy.reducer", mirrored, {"strategy", "reducer"}},
      {"strategy.partitioner", sharded, {"strategy", "partitioner"}},
  };
}

std::string dotted(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// The keys the parser lists for the object at site.at.
std::vector<std::string> probe(const probe_site& site) {
  json config = site.base;
  json* object = &config;
  for (const auto& name : site.at) object = &(*object)[name];
  (*object)[kProbeKey] = 1;
  const std::string marker = "unknown key (expected one of: ";
  try {
    troupe::parse_job_config(config);
  } catch (const config_error& e) {
    const std::string what = e.what();
    const auto at = what.find(marker);
    if (at != std::string::npos && what.back() == ')') {
      const auto from = at + marker.size();
      return json::parse("[" + what.substr(from, what.size() - 1 - from) + "]");
    }
    throw std::runtime_error("probe of " + site.path + ": unexpected error: " + what);
  }
  throw std::runtime_error("probe of " + site.path + ": the parser took an unknown key");
}

bool is_site(const std::vector<probe_site>& sites, const std::string& key) {
  for (const auto& s : sites)
    if ((s.path == key && !s.also_a_value) || s.path.rfind(key + ".", 0) == 0) return true;
  return false;
}

// Every key a config may set that is not an object of the schema, in the
// parser's order: the objects' own keys, then each strategy's.
std::vector<std::string> accepted_keys() {
  const auto sites = probe_sites();
  std::vector<std::string> keys;
  auto add = [&](const std::string& key) {
    if (!is_site(sites, key) && key != "strategy" &&
        std::find(keys.begin(), keys.end(), key) == keys.end())
      keys.push_back(key);
  };
  for (const auto& site : sites)
    for (const auto& key : probe(site)) add(dotted(site.path, key));
  add("strategy.kind");
  for (const auto& kind : troupe::registered_strategies())
    for (const auto& key : troupe::find_strategy_rules(kind)->keys()) add("strategy." + key.name);
  return keys;
}

void flatten(const json& j, const std::string& path, std::map<std::string, json>& out) {
  if (j.is_object() && !j.empty() && path != "model.layers") {
    for (const auto& [key, value] : j.items()) flatten(value, dotted(path, key), out);
    return;
  }
  out[path] = j;
}

// Configs that bring every section into the effective config: each
// strategy, each data format, a cluster.
std::vector<json> default_contexts() {
  std::vector<json> contexts = {json::object()};
  for (const auto& kind : troupe::registered_strategies()) {
    json c = {{"strategy", {{"kind", kind}}}};
    if (!troupe::find_strategy_rules(kind)->trains_classifier()) {
      c["model"] = {{"kind", "policy_value_mlp"}};
      c["training"] = {{"max_steps", 1}};
    }
    contexts.push_back(c);
  }
  contexts.push_back({{"data", {{"format", "npz"}, {"train", "a.npz"}, {"test", "b.npz"}}}});
  contexts.push_back(
      {{"data", {{"format", "csv"}, {"train", "a"}, {"test", "b"}, {"label", "l"}}}});
  contexts.push_back({{"cluster", {{"tasks", {{"chief", {"127.0.0.1:7000"}}}}}}});
  return contexts;
}

// Each key's default: its value in the effective config of every context
// that does not set it. A key with two defaults is reported as an error.
std::map<std::string, json> defaults() {
  std::map<std::string, json> out;
  for (const auto& context : default_contexts()) {
    std::map<std::string, json> given, effective;
    flatten(context, "", given);
    flatten(troupe::to_json(troupe::parse_job_config(context)), "", effective);
    for (const auto& [key, value] : effective) {
      if (given.count(key)) continue;
      auto [it, fresh] = out.emplace(key, value);
      if (!fresh && it->second != value)
        throw std::runtime_error(key + ": default " + it->second.dump() + " in one context, " +
                                 value.dump() + " in another (" + context.dump() + ")");
    }
  }
  return out;
}

struct reference_row {
  std::string key;
  std::optional<json> default_value;  // none: the effective config omits the key
};

std::vector<reference_row> reference() {
  const auto values = defaults();
  std::vector<reference_row> rows;
  for (const auto& key : accepted_keys()) {
    auto it = values.find(key);
    rows.push_back({key, it == values.end() ? std::nullopt : std::optional<json>(it->second)});
  }
  return rows;
}

int print_reference() {
  for (const auto& row : reference())
    std::cout << row.key << '\t' << (row.default_value ? row.default_value->dump() : "—") << '\n';
  return 0;
}

// One key row, "| `key` | default | meaning |": the key and the default cell
// (trimmed), or nothing for any other line. (By hand, not std::regex: GCC
// 12's <regex> trips -Wmaybe-uninitialized in the ASan build.)
std::optional<std::pair<std::string, std::string>> key_row(const std::string& line) {
  if (line.rfind("| `", 0) != 0) return std::nullopt;
  const auto key_end = line.find('`', 3);
  if (key_end == std::string::npos || line.compare(key_end, 4, "` | ") != 0) return std::nullopt;
  std::string key = line.substr(3, key_end - 3);
  const bool key_chars = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '<' ||
           c == '>';
  });
  const auto cell_end = line.find(" |", key_end + 4);
  if (!key_chars || cell_end == std::string::npos) return std::nullopt;
  std::string cell = line.substr(key_end + 4, cell_end - (key_end + 4));
  if (cell.find('|') != std::string::npos) return std::nullopt;
  while (!cell.empty() && cell.back() == ' ') cell.pop_back();
  return std::make_pair(std::move(key), std::move(cell));
}

// The document's key rows: "| `key` | default | meaning |".
std::map<std::string, std::string> documented_rows(const std::string& file,
                                                   std::vector<std::string>& errors) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot open " + file);
  std::map<std::string, std::string> rows;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    auto row = key_row(line);
    if (!row) continue;
    if (!rows.emplace(row->first, row->second).second)
      errors.push_back(file + ":" + std::to_string(n) + ": " + row->first + " documented twice");
  }
  return rows;
}

// A default cell holds the value as JSON in backticks: `128`, `"auto"`.
std::optional<json> cell_value(const std::string& cell) {
  if (cell.size() < 3 || cell.front() != '`' || cell.back() != '`') return std::nullopt;
  const std::string inner = cell.substr(1, cell.size() - 2);
  if (inner.find('`') != std::string::npos) return std::nullopt;
  json v = json::parse(inner, nullptr, false);
  if (v.is_discarded()) return std::nullopt;
  return v;
}

// A key the effective config omits when unset (model.layers, cluster.tls...)
// may say in words what decides it.
void check_row(const reference_row& row, const std::string& cell,
               std::vector<std::string>& errors) {
  if (!row.default_value) return;
  const auto documented = cell_value(cell);
  if (!documented || *documented != *row.default_value)
    errors.push_back(row.key + ": the default is `" + row.default_value->dump() +
                     "`, the document says " + cell);
}

int check_reference(const std::string& file) {
  std::vector<std::string> errors;
  auto rows = documented_rows(file, errors);
  const auto sites = probe_sites();
  for (const auto& row : reference()) {
    auto it = rows.find(row.key);
    if (it == rows.end()) {
      errors.push_back(row.key + ": accepted by the parser, not documented");
      continue;
    }
    check_row(row, it->second, errors);
    rows.erase(it);
  }
  for (const auto& [key, cell] : rows) {
    const auto dot = key.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : key.substr(0, dot);
    const bool probed = parent.empty() || parent == "strategy" || is_site(sites, parent);
    errors.push_back(key + (probed ? ": documented, but the parser refuses it"
                                   : ": documented, but its object " + parent +
                                         " is not probed (tests/config_reference.cpp)"));
  }
  for (const auto& e : errors) std::cerr << file << ": " << e << '\n';
  if (!errors.empty()) std::cerr << "(`config_reference print` lists every key with its default)\n";
  return errors.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: config_reference print | config_reference check FILE.md";
  try {
    if (argc == 2 && std::string(argv[1]) == "print") return print_reference();
    if (argc == 3 && std::string(argv[1]) == "check") return check_reference(argv[2]);
    std::cerr << usage << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "config_reference: " << e.what() << '\n';
    return 1;
  }
}
