// The cluster from the environment (see cluster_env.hpp).
#include "config/cluster_env.hpp"

#include <algorithm>
#include <optional>

#include "config/job_config.hpp"

extern char** environ;

namespace troupe {
namespace {

std::string quote(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

uint64_t to_number(std::string_view digits) {
  uint64_t v = 0;
  for (char c : digits) v = v * 10 + static_cast<uint64_t>(c - '0');
  return v;
}

const std::string* find(const environment_map& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

const std::string& require(const environment_map& env, const std::string& name,
                           const std::string& why) {
  const std::string* v = find(env, name);
  if (!v) throw cluster_env_error(name + ": not set; " + why);
  return *v;
}

// `name`'s value as an integer in [lo, hi]; `range` says the range in the
// error ("1 or more", "0..WORLD_SIZE-1 (0..2)").
int64_t integer(const std::string& name, const std::string& value, int64_t lo, int64_t hi,
                const std::string& range) {
  if (!all_digits(value) || to_number(value) < static_cast<uint64_t>(lo) ||
      to_number(value) > static_cast<uint64_t>(hi))
    throw cluster_env_error(name + ": expected an integer " + range + ", got " + quote(value));
  return static_cast<int64_t>(to_number(value));
}

constexpr int64_t kMaxWorld = 65536;

int64_t world_size(const environment_map& env, const std::string& name, const std::string& why) {
  return integer(name, require(env, name, why), 1, kMaxWorld, "in 1.." + std::to_string(kMaxWorld));
}

int64_t rank(const environment_map& env, const std::string& name, const std::string& world_name,
             int64_t world) {
  return integer(name, require(env, name, "it says which rank this process is"), 0, world - 1,
                 "in 0.." + world_name + "-1 (0.." + std::to_string(world - 1) + ")");
}

uint16_t port(const std::string& name, const std::string& value) {
  return static_cast<uint16_t>(integer(name, value, 1, 65535, "in 1..65535"));
}

// `value` as "host:port", for the error naming `name`.
std::string host_port_of(const std::string& name, const std::string& value) {
  try {
    parse_host_port(value);
  } catch (const std::invalid_argument& e) {
    throw cluster_env_error(name + ": " + e.what());
  }
  return value;
}

struct flavour_result {
  int64_t rank = 0, world = 1, local_rank = -1;
  std::string chief;
};

flavour_result troupe_flavour(const environment_map& env) {
  flavour_result r;
  r.world = world_size(env, "TROUPE_WORLD_SIZE", "it says how many ranks the job has");
  r.rank = rank(env, "TROUPE_RANK", "TROUPE_WORLD_SIZE", r.world);
  r.chief = host_port_of(
      "TROUPE_CHIEF",
      require(env, "TROUPE_CHIEF", "it gives the chief's address as host:port (rank 0's)"));
  return r;
}

flavour_result torch_flavour(const environment_map& env) {
  flavour_result r;
  r.world = world_size(env, "WORLD_SIZE", "it says how many ranks the job has");
  r.rank = rank(env, "RANK", "WORLD_SIZE", r.world);
  const auto& addr = require(env, "MASTER_ADDR", "it names the chief's (rank 0's) host");
  const auto p =
      port("MASTER_PORT", require(env, "MASTER_PORT", "it gives the chief's (rank 0's) port"));
  r.chief = host_port_of("MASTER_ADDR", format_host_port(addr, p));
  if (const auto* local = find(env, "LOCAL_RANK"))
    r.local_rank = integer("LOCAL_RANK", *local, 0, kMaxWorld, "0 or more");
  return r;
}

flavour_result slurm_flavour(const environment_map& env, const cluster_spec& spec) {
  flavour_result r;
  r.world = world_size(env, "SLURM_NTASKS", "it says how many tasks the job step has");
  r.rank = rank(env, "SLURM_PROCID", "SLURM_NTASKS", r.world);
  if (const auto* local = find(env, "SLURM_LOCALID"))
    r.local_rank = integer("SLURM_LOCALID", *local, 0, kMaxWorld, "0 or more");
  const auto& list =
      require(env, "SLURM_JOB_NODELIST", "the chief runs on the first host of the job's nodes");
  std::vector<std::string> hosts;
  try {
    hosts = expand_hostlist(list);
  } catch (const std::invalid_argument& e) {
    throw cluster_env_error("SLURM_JOB_NODELIST: " + std::string(e.what()));
  }
  uint16_t p = 0;
  if (const auto* given = find(env, "TROUPE_CHIEF_PORT")) {
    p = port("TROUPE_CHIEF_PORT", *given);
  } else if (spec.port != 0) {
    p = spec.port;
  } else {
    const auto& id = require(env, "SLURM_JOB_ID",
                             "the chief's port is derived from it when neither "
                             "TROUPE_CHIEF_PORT nor cluster.port gives one");
    if (!all_digits(id))
      throw cluster_env_error("SLURM_JOB_ID: expected an integer, got " + quote(id));
    p = slurm_chief_port(to_number(id));
  }
  r.chief = host_port_of("SLURM_JOB_NODELIST", format_host_port(hosts.front(), p));
  return r;
}

// One bracket's ranges "01-03,07" -> {"01","02","03","07"}, widths kept.
std::vector<std::string> expand_ranges(std::string_view ranges, std::string_view whole) {
  std::vector<std::string> out;
  const std::string where = " in " + quote(whole);
  std::size_t start = 0;
  while (start <= ranges.size()) {
    auto comma = ranges.find(',', start);
    auto item = ranges.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    auto dash = item.find('-');
    auto lo_text = item.substr(0, dash);
    auto hi_text = dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    if (!all_digits(lo_text) || !all_digits(hi_text))
      throw std::invalid_argument("expected a number or a range like 01-04, got " + quote(item) +
                                  where);
    const uint64_t lo = to_number(lo_text), hi = to_number(hi_text);
    if (hi < lo)
      throw std::invalid_argument("the range " + quote(item) + " runs backwards" + where);
    if (hi - lo >= static_cast<uint64_t>(kMaxWorld))
      throw std::invalid_argument("the range " + quote(item) + " names more than " +
                                  std::to_string(kMaxWorld) + " hosts" + where);
    for (uint64_t v = lo; v <= hi; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo_text.size())
        digits.insert(0, lo_text.size() - digits.size(), '0');  // zero padding kept
      out.push_back(std::move(digits));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// One host expression without top-level commas: "x[1-2]-y[3-4]".
std::vector<std::string> expand_host(std::string_view expr, std::string_view whole) {
  std::vector<std::string> out{""};
  std::size_t i = 0;
  while (i < expr.size()) {
    std::vector<std::string> parts;
    if (expr[i] == '[') {
      auto close = expr.find(']', i);
      if (close == std::string_view::npos)
        throw std::invalid_argument("an unclosed '[' in " + quote(whole));
      parts = expand_ranges(expr.substr(i + 1, close - i - 1), whole);
      i = close + 1;
    } else {
      auto next = expr.find_first_of("[]", i);
      if (next != std::string_view::npos && expr[next] == ']')
        throw std::invalid_argument("a ']' without its '[' in " + quote(whole));
      parts.emplace_back(expr.substr(i, next == std::string_view::npos ? next : next - i));
      i = next == std::string_view::npos ? expr.size() : next;
    }
    std::vector<std::string> grown;
    for (const auto& prefix : out)
      for (const auto& p : parts) grown.push_back(prefix + p);
    if (grown.size() > static_cast<std::size_t>(kMaxWorld))
      throw std::invalid_argument("more than " + std::to_string(kMaxWorld) + " hosts in " +
                                  quote(whole));
    out = std::move(grown);
  }
  return out;
}

}  // namespace

environment_map process_environment() {
  environment_map env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

bool environment_has_cluster(const environment_map& env) {
  for (const char* name :
       {"TROUPE_RANK", "TROUPE_WORLD_SIZE", "TROUPE_CHIEF", "RANK", "WORLD_SIZE", "SLURM_PROCID"})
    if (env.count(name)) return true;
  return false;
}

std::vector<std::string> expand_hostlist(std::string_view list) {
  if (list.empty()) throw std::invalid_argument("the host list is empty");
  std::vector<std::string> hosts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const bool end = i == list.size();
    if (!end && list[i] == '[') ++depth;
    if (!end && list[i] == ']') --depth;
    if (!end && (list[i] != ',' || depth > 0)) continue;
    auto expr = list.substr(start, i - start);
    if (expr.empty()) throw std::invalid_argument("an empty host name in " + quote(list));
    for (auto& h : expand_host(expr, list)) hosts.push_back(std::move(h));
    if (hosts.size() > static_cast<std::size_t>(kMaxWorld))
      throw std::invalid_argument("more than " + std::to_string(kMaxWorld) + " hosts in " +
                                  quote(list));
    start = i + 1;
  }
  return hosts;
}

uint16_t slurm_chief_port(uint64_t job_id) {
  return static_cast<uint16_t>(20000 + job_id % 12000);
}

task_id role_of_rank(int64_t rank, int64_t ps_ranks) {
  if (rank == 0) return {"chief", 0};
  if (rank <= ps_ranks) return {"ps", rank - 1};
  return {"worker", rank - 1 - ps_ranks};
}

std::map<std::string, std::vector<std::string>> tasks_of_ranks(
    const std::vector<std::string>& addresses, int64_t ps_ranks) {
  std::map<std::string, std::vector<std::string>> tasks;
  for (std::size_t r = 0; r < addresses.size(); ++r)
    tasks[role_of_rank(static_cast<int64_t>(r), ps_ranks).job].push_back(addresses[r]);
  return tasks;
}

cluster_env resolve_cluster_env(const environment_map& env, const cluster_spec& spec,
                                const std::string& host_name) {
  cluster_env out;
  flavour_result f;
  const auto has_any = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return env.count(n); });
  };
  if (has_any({"TROUPE_RANK", "TROUPE_WORLD_SIZE", "TROUPE_CHIEF"})) {
    out.source = "TROUPE_RANK";
    f = troupe_flavour(env);
  } else if (has_any({"RANK", "WORLD_SIZE"})) {
    out.source = "RANK";
    f = torch_flavour(env);
  } else if (has_any({"SLURM_PROCID"})) {
    out.source = "SLURM_PROCID";
    f = slurm_flavour(env, spec);
  } else {
    throw cluster_env_error(
        "the config has no cluster.tasks and the environment names no rank: set TROUPE_RANK, "
        "TROUPE_WORLD_SIZE and TROUPE_CHIEF, or torchrun's RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT, or run under SLURM's srun (SLURM_PROCID), or give --task");
  }
  out.rank = f.rank;
  out.world_size = f.world;
  out.local_rank = f.local_rank;
  out.chief = f.chief;
  if (spec.ps_ranks > out.world_size - 1)
    throw config_error("cluster.roles.ps",
                       "expected at most the " + std::to_string(out.world_size - 1) +
                           " ranks after the chief (world size " + std::to_string(out.world_size) +
                           " from " + out.source + "'s set), got " + std::to_string(spec.ps_ranks));
  out.task = role_of_rank(out.rank, spec.ps_ranks);
  if (out.rank == 0) {
    const auto chief = parse_host_port(out.chief);
    out.advertise_host = chief.host;
    out.listen_port = chief.port;
    return out;
  }
  if (const auto* a = find(env, "TROUPE_ADVERTISE_ADDR")) {
    out.advertise_host = *a;
  } else if (const auto* n = find(env, "SLURMD_NODENAME"); n && out.source == "SLURM_PROCID") {
    out.advertise_host = *n;
  } else {
    out.advertise_host = host_name;
  }
  try {
    parse_host_port(format_host_port(out.advertise_host, 1));  // the host part's rules
  } catch (const std::invalid_argument&) {
    throw cluster_env_error(
        (env.count("TROUPE_ADVERTISE_ADDR") ? std::string("TROUPE_ADVERTISE_ADDR")
                                            : std::string("this machine's host name")) +
        ": expected a host name or an IP address, got " + quote(out.advertise_host) +
        "; set TROUPE_ADVERTISE_ADDR to the address other ranks reach this one at");
  }
  if (const auto* p = find(env, "TROUPE_PORT")) out.listen_port = port("TROUPE_PORT", *p);
  return out;
}

}  // namespace troupe
