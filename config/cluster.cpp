// The cluster spec: task names, addresses, and where a job's actors live.
#include "config/cluster.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "config/job_config.hpp"
#include "config/json_read.hpp"
#include "config/strategy_rules.hpp"

namespace troupe {
namespace {

using nlohmann::json;

using json_read::quote;

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw config_error(path, message);
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// A decimal number without sign or leading zeros, at most `max_digits` long.
bool parse_decimal(std::string_view s, std::size_t max_digits, uint64_t& out) {
  if (s.empty() || s.size() > max_digits || !std::all_of(s.begin(), s.end(), is_digit))
    return false;
  if (s.size() > 1 && s[0] == '0') return false;
  out = 0;
  for (char c : s) out = out * 10 + static_cast<uint64_t>(c - '0');
  return true;
}

bool valid_hostname(std::string_view h) {
  if (h.empty() || h.size() > 253) return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '.' ||
           c == '-' || c == '_';
  });
}

bool valid_ipv6(std::string_view h) {
  if (h.size() < 2 || h.find(':') == std::string_view::npos) return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' || c == '.';
  });
}

std::string block_of(const std::string& job, std::size_t n) {
  return n == 1 ? job + ":0" : job + ":0.." + job + ":" + std::to_string(n - 1);
}

// Items 0..n-1 in contiguous blocks over `parts` (the first n % parts get one more).
std::vector<std::vector<int64_t>> blocks(int64_t n, int64_t parts) {
  std::vector<std::vector<int64_t>> out(static_cast<std::size_t>(parts));
  int64_t next = 0;
  for (int64_t p = 0; p < parts; ++p) {
    int64_t count = n / parts + (p < n % parts ? 1 : 0);
    for (int64_t k = 0; k < count; ++k) out[static_cast<std::size_t>(p)].push_back(next++);
  }
  return out;
}

std::size_t job_size(const cluster_spec& spec, const std::string& job) {
  auto it = spec.tasks.find(job);
  return it == spec.tasks.end() ? 0 : it->second.size();
}

}  // namespace

const std::vector<std::string>& cluster_job_names() {
  static const std::vector<std::string> names = {"chief", "worker", "ps"};
  return names;
}

std::string task_id::str() const {
  return job + ":" + std::to_string(index);
}

host_port parse_host_port(std::string_view s) {
  const std::string bad = "expected \"host:port\", got " + quote(s);
  host_port out;
  std::string_view port;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      throw std::invalid_argument(bad);
    std::string_view host = s.substr(1, close - 1);
    if (!valid_ipv6(host)) throw std::invalid_argument(bad);
    out.host = std::string(host);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string_view::npos) throw std::invalid_argument(bad);
    std::string_view host = s.substr(0, colon);
    if (!valid_hostname(host)) throw std::invalid_argument(bad);
    out.host = std::string(host);
    port = s.substr(colon + 1);
  }
  if (port.empty() || !std::all_of(port.begin(), port.end(), is_digit))
    throw std::invalid_argument(bad);
  uint64_t p = 0;
  if (!parse_decimal(port, 5, p) || p < 1 || p > 65535)
    throw std::invalid_argument("expected \"host:port\" with a port in 1..65535, got " + quote(s));
  out.port = static_cast<uint16_t>(p);
  return out;
}

std::string format_host_port(const std::string& host, uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

task_id parse_task_name(std::string_view name) {
  auto colon = name.find(':');
  if (colon == std::string_view::npos)
    throw std::invalid_argument("expected a task name \"job:index\" like \"worker:1\", got " +
                                quote(name));
  std::string job(name.substr(0, colon));
  const auto& jobs = cluster_job_names();
  if (std::find(jobs.begin(), jobs.end(), job) == jobs.end())
    throw std::invalid_argument("unknown job " + quote(job) + " in task name " + quote(name) +
                                " (expected \"chief\", \"worker\" or \"ps\")");
  uint64_t index = 0;
  if (!parse_decimal(name.substr(colon + 1), 9, index))
    throw std::invalid_argument(
        "expected a task name \"job:index\" with a decimal index like \"worker:1\", got " +
        quote(name));
  return {job, static_cast<int64_t>(index)};
}

std::vector<task_id> all_tasks(const cluster_spec& spec) {
  std::vector<task_id> out;
  for (const auto& job : cluster_job_names()) {
    std::size_t n = job_size(spec, job);
    for (std::size_t i = 0; i < n; ++i) out.push_back({job, static_cast<int64_t>(i)});
  }
  return out;
}

bool has_task(const cluster_spec& spec, const task_id& task) {
  return task.index >= 0 && static_cast<std::size_t>(task.index) < job_size(spec, task.job);
}

const std::string& task_address(const cluster_spec& spec, const task_id& task) {
  if (!has_task(spec, task)) {
    std::size_t n = job_size(spec, task.job);
    throw std::out_of_range("no task " + task.str() + " in the cluster spec" +
                            (n == 0
                                 ? " (it has no \"" + task.job + "\" job)"
                                 : " (" + task.job + " has tasks " + block_of(task.job, n) + ")"));
  }
  return spec.tasks.at(task.job)[static_cast<std::size_t>(task.index)];
}

const task_placement& placement_of(const std::vector<task_placement>& placement,
                                   const task_id& task) {
  for (const auto& p : placement)
    if (p.task == task) return p;
  throw std::out_of_range("no placement for task " + task.str());
}

namespace {

// Every placement starts from the chief (it runs the coordinator and, without
// workers, every replica), so a spec without exactly one is refused here, not
// only when the config is read: a spec the rendezvous filled in comes here too.
void require_one_chief(const cluster_spec& spec) {
  std::size_t chiefs = job_size(spec, "chief");
  if (chiefs == 0)
    fail("cluster.tasks.chief",
         "missing; a cluster needs exactly one chief task (it runs the coordinator)");
  if (chiefs != 1)
    fail("cluster.tasks.chief",
         "expected exactly one address (one chief task), got " + std::to_string(chiefs));
}

// Resolves one job's placement: the counts the strategy and the spec give,
// and the tasks' entries, filled in by blocks (no "hosts") or from
// cluster.hosts, which is checked key by key.
class placement_builder {
 public:
  explicit placement_builder(const job_config& job)
      : job_(job),
        spec_(*job.cluster),
        kind_(job.strategy.kind),
        rules_(rules_of(kind_)),
        sharded_(rules_.has_variable_shards()),
        S_(job.strategy.shards),
        W_(static_cast<int64_t>(job_size(spec_, "worker"))),
        P_(static_cast<int64_t>(job_size(spec_, "ps"))),
        R_(rules_.replica_count(job)),
        R_key_(rules_.replica_count_key()),
        unit_(rules_.replica_unit()) {}

  std::vector<task_placement> build() {
    if (!sharded_ && P_ > 0)
      fail("cluster.tasks.ps", "the " + kind_ +
                                   " strategy has no variable shards for ps tasks to host; "
                                   "remove the \"ps\" job");
    rules_.check_cluster_jobs(job_, W_, P_, !spec_.hosts.empty());
    for (const auto& t : all_tasks(spec_)) {
      task_placement p;
      p.task = t;
      p.coordinator = t.job == "chief";
      out_.push_back(std::move(p));
    }
    if (spec_.hosts.empty()) {
      place_in_blocks();
    } else {
      check_host_keys();
      place_from_hosts();
      check_all_placed();
    }
    return std::move(out_);
  }

 private:
  // A name that is listed but not built (a planned strategy) places like a
  // strategy without shards; `troupe run` refuses it later.
  static const strategy_rules& rules_of(const std::string& kind) {
    struct unbuilt final : strategy_rules {
      std::string name() const override { return ""; }
    };
    static const unbuilt plain;
    auto found = find_strategy_rules(kind);
    return found ? *found : plain;
  }

  task_placement& entry(const task_id& t) {
    for (auto& p : out_)
      if (p.task == t) return p;
    throw std::logic_error("no task " + t.str());
  }

  std::string default_device(int64_t r) const {
    return job_.devices[static_cast<std::size_t>(r) % job_.devices.size()];
  }

  // Without "hosts": replicas (parameter_server: workers) in blocks over the
  // worker tasks, shards over the ps tasks; the chief hosts them without.
  void place_in_blocks() {
    if (W_ == 0) {
      for (int64_t r = 0; r < R_; ++r) entry({"chief", 0}).replicas.push_back(r);
    } else {
      if (R_ < W_)
        fail(R_key_, "expected >= the " + std::to_string(W_) +
                         " worker tasks of cluster.tasks.worker (each hosts at "
                         "least one " +
                         unit_ + "), got " + std::to_string(R_));
      auto b = blocks(R_, W_);
      for (int64_t w = 0; w < W_; ++w)
        entry({"worker", w}).replicas = b[static_cast<std::size_t>(w)];
    }
    if (sharded_) place_shards_in_blocks();
    for (auto& p : out_)
      for (int64_t r : p.replicas) p.devices.push_back(default_device(r));
  }

  void place_shards_in_blocks() {
    if (P_ == 0) {
      for (int64_t s = 0; s < S_; ++s) entry({"chief", 0}).shards.push_back(s);
      return;
    }
    if (S_ < P_)
      fail("strategy.shards", "expected >= the " + std::to_string(P_) +
                                  " ps tasks of cluster.tasks.ps (each hosts at least one "
                                  "shard), got " +
                                  std::to_string(S_));
    auto b = blocks(S_, P_);
    for (int64_t s = 0; s < P_; ++s) entry({"ps", s}).shards = b[static_cast<std::size_t>(s)];
  }

  // An explicit "hosts": every key names a task of the spec.
  void check_host_keys() const {
    for (const auto& [key, th] : spec_.hosts) {
      const std::string path = json_read::join("cluster.hosts", key);
      task_id t;
      try {
        t = parse_task_name(key);
      } catch (const std::invalid_argument& e) {
        fail(path, e.what());
      }
      if (t.str() != key)
        fail(path, "expected a task name \"job:index\" like \"worker:1\", got " + quote(key));
      if (!has_task(spec_, t)) {
        std::size_t n = job_size(spec_, t.job);
        fail(path, "no task " + key + " in cluster.tasks" +
                       (n == 0 ? " (it has no \"" + t.job + "\" job)"
                               : " (cluster.tasks." + t.job + " has " + std::to_string(n) +
                                     (n == 1 ? " task: " : " tasks: ") + block_of(t.job, n) + ")"));
      }
    }
  }

  void place_from_hosts() {
    for (auto& p : out_) {
      auto it = spec_.hosts.find(p.task.str());
      if (it != spec_.hosts.end()) place_on(p, it->second);
    }
  }

  // One task's entry of cluster.hosts: its replicas, their devices, its shards.
  void place_on(task_placement& p, const task_hosts& th) {
    const std::string name = p.task.str();
    const std::string path = "cluster.hosts." + name;
    for (std::size_t i = 0; i < th.replicas.size(); ++i)
      claim_replica(th.replicas[i], name, path + ".replicas[" + std::to_string(i) + "]");
    if (!th.devices.empty() && th.devices.size() != th.replicas.size())
      fail(path + ".devices", "expected one device per " + unit_ + " (" +
                                  std::to_string(th.replicas.size()) + "), got " +
                                  std::to_string(th.devices.size()));
    if (!sharded_ && !th.shards.empty())
      fail(path + ".shards", "the " + kind_ + " strategy has no variable shards");
    for (std::size_t i = 0; i < th.shards.size(); ++i)
      claim_shard(th.shards[i], name, path + ".shards[" + std::to_string(i) + "]");
    p.replicas = th.replicas;
    p.devices = th.devices;
    if (p.devices.empty())
      for (int64_t r : p.replicas) p.devices.push_back(default_device(r));
    p.shards = th.shards;
  }

  void claim_replica(int64_t r, const std::string& name, const std::string& path) {
    if (r < 0 || r >= R_)
      fail(path, "expected an integer in [0, " + std::to_string(R_ - 1) + "] (" + R_key_ + " is " +
                     std::to_string(R_) + "), got " + std::to_string(r));
    auto [owner, fresh] = replica_owner_.emplace(r, name);
    if (!fresh)
      fail(path, unit_ + " " + std::to_string(r) + " is already placed on " + owner->second);
  }

  void claim_shard(int64_t s, const std::string& name, const std::string& path) {
    if (s < 0 || s >= S_)
      fail(path, "expected an integer in [0, " + std::to_string(S_ - 1) + "] (strategy.shards is " +
                     std::to_string(S_) + "), got " + std::to_string(s));
    auto [owner, fresh] = shard_owner_.emplace(s, name);
    if (!fresh) fail(path, "shard " + std::to_string(s) + " is already placed on " + owner->second);
  }

  // Every replica and shard on a task, and every task but the chief hosting one.
  void check_all_placed() const {
    for (int64_t r = 0; r < R_; ++r)
      if (!replica_owner_.count(r))
        fail("cluster.hosts", unit_ + " " + std::to_string(r) + " is not placed on any task (" +
                                  R_key_ + " is " + std::to_string(R_) + ")");
    if (sharded_)
      for (int64_t s = 0; s < S_; ++s)
        if (!shard_owner_.count(s))
          fail("cluster.hosts", "shard " + std::to_string(s) +
                                    " is not placed on any task (strategy.shards is " +
                                    std::to_string(S_) + ")");
    for (const auto& p : out_)
      if (!p.coordinator && p.replicas.empty() && p.shards.empty())
        fail("cluster.hosts", "task " + p.task.str() +
                                  " hosts nothing; place replicas or shards on it, or remove it "
                                  "from cluster.tasks");
  }

  const job_config& job_;
  const cluster_spec& spec_;
  const std::string& kind_;
  const strategy_rules& rules_;
  const bool sharded_;
  const int64_t S_;  // variable shards
  const int64_t W_;  // worker tasks
  const int64_t P_;  // ps tasks
  const int64_t R_;  // replicas (parameter_server: workers)
  const std::string R_key_;
  const std::string unit_;  // "replica", "worker", ...
  std::vector<task_placement> out_;
  std::map<int64_t, std::string> replica_owner_, shard_owner_;  // by index: the task's name
};

}  // namespace

std::vector<task_placement> resolve_placement(const job_config& job) {
  if (!job.cluster) throw config_error("cluster", "the job has no cluster spec");
  require_one_chief(*job.cluster);
  return placement_builder(job).build();
}

void check_cluster(const job_config& job) {
  if (!job.cluster) return;
  const cluster_spec& spec = *job.cluster;
  // From the environment: checked once the rendezvous has filled it in.
  if (spec.tasks.empty()) return;
  resolve_placement(job);
}

}  // namespace troupe
