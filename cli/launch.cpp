// `troupe launch`: local child processes for every task of a cluster spec.
#include "cli/launch.hpp"

#include <unistd.h>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "config/secret.hpp"
#include "config/strategy_rules.hpp"
#include "net/launch_enrol.hpp"

namespace troupe::launch {
namespace {

constexpr int kMaxRestarts = 1000000;  // --restart-workers at most

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<std::size_t>(n));
}

// Whether the tasks' links take their certificates from the job CA, as
// net/secure_link.cpp's link_security_for decides for a node.
bool uses_job_ca(const cluster_spec& spec) {
  return !spec.insecure && spec.tls.ca.empty() &&
         spec.identity == cluster_spec::identity_mode::job_ca;
}

// Per-task identity (cluster.identity "job_ca", the default): a CA made
// here, in memory only, issues each start of a task its certificate over
// that start's own socket (net/launch_enrol.hpp). False (said on stderr)
// when the CA cannot be made.
bool issue_from_job_ca(std::optional<job_authority>& ca, supervise_options& so) {
  try {
    ca.emplace();
  } catch (const job_ca_error& e) {
    std::cerr << "troupe launch: cannot make the job CA: " << e.what() << "\n";
    return false;
  }
  so.enrol = [&ca](const child& c, std::string_view request, std::string& refusal) {
    return launch_enrol::answer(*ca, c.name, request, refusal);
  };
  std::cerr << "troupe launch: a job CA made for this launch issues each task its "
               "certificate (cluster.identity \"job_ca\")\n";
  return true;
}

}  // namespace

void apply_failure_policy(std::vector<child>& children, const job_config& job) {
  auto rules = find_strategy_rules(job.strategy.kind);
  const bool survives = rules && rules->survives_lost_workers();
  std::vector<task_placement> placement;
  try {
    placement = resolve_placement(job);
  } catch (const std::exception&) {
    // A bad placement: every node reports it and exits 2.
  }
  for (auto& c : children) {
    task_id t;
    try {
      t = parse_task_name(c.name);
    } catch (const std::exception&) {
      continue;
    }
    c.chief = t.job == "chief";
    if (c.chief) continue;
    bool shards = false;
    for (const auto& p : placement)
      if (p.task == t) shards = !p.shards.empty();
    if (!survives)
      c.why_fatal = "the " + job.strategy.kind + " strategy does not go on without a task";
    else if (shards)
      c.why_fatal = "the job does not go on without it: it hosts variable shards";
    else
      c.survivable = t.job == "worker";
  }
}

std::vector<child> node_children(const cluster_spec& spec, const std::string& config_file,
                                 const launch_options& opts) {
  std::vector<std::string> base;
  const char* env_cmd = std::getenv("TROUPE_LAUNCH_NODE_CMD");
  if (env_cmd && *env_cmd)
    base = {"/bin/sh", "-c", std::string(env_cmd) + " \"$@\"", "troupe-node"};
  else if (!opts.node_command.empty())
    base = opts.node_command;
  else
    base = {self_exe(), "node"};
  std::vector<child> out;
  for (const auto& task : all_tasks(spec)) {
    child c;
    c.name = task.str();
    c.argv = base;
    for (const char* a : {"--config", config_file.c_str(), "--task", c.name.c_str()})
      c.argv.emplace_back(a);
    if (!opts.output_dir.empty()) {
      c.argv.emplace_back("--output");
      c.argv.push_back(opts.output_dir);
    }
    if (opts.resume) c.argv.emplace_back("--resume");
    if (opts.overwrite) c.argv.emplace_back("--overwrite");
    c.argv.insert(c.argv.end(), opts.extra_args.begin(), opts.extra_args.end());
    c.env = {"TROUPE_TASK=" + c.name};
    out.push_back(std::move(c));
  }
  return out;
}

int cmd_launch(const std::vector<std::string>& args,
               const std::function<int(const std::string&)>& bad_usage) {
  std::string file;
  launch_options opts;
  const std::string restarts_needed =
      "--restart-workers needs the number of restarts (0 to " + std::to_string(kMaxRestarts) + ")";
  const auto take_restarts = [&](const std::string& v) {
    std::size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(v, &used, 10);
    } catch (const std::exception&) {
      used = 0;
    }
    if (v.empty() || used != v.size() || !std::isdigit(static_cast<unsigned char>(v[0])) || n < 0 ||
        n > kMaxRestarts)
      return restarts_needed + ", got '" + v + "'";
    opts.restart_workers = static_cast<int>(n);
    return std::string();
  };
  cli::option_parser options("launch");
  options.config_file(file, true, "launch needs a config file (--config FILE)")
      .rest_after_dashes(opts.extra_args)
      .value("--output", opts.output_dir, "--output needs a directory")
      .value("--restart-workers", take_restarts, restarts_needed)
      .flag("--resume", opts.resume)
      .flag("--overwrite", opts.overwrite)
      .exclusive("--resume", "--overwrite");
  if (auto why = options.parse(args)) return bad_usage(*why);
  job_config cfg;
  try {
    cfg = load_job_config(file);
  } catch (const config_error& e) {
    std::cerr << "troupe: " << (e.path().empty() ? "" : file + ": ") << e.what() << "\n";
    return 2;
  }
  if (!cfg.cluster) {
    std::cerr << "troupe: " << file
              << ": no \"cluster\" section; troupe launch starts the tasks of a cluster spec "
                 "(\"cluster\": {\"tasks\": {\"chief\": [\"127.0.0.1:7000\"], ...}}); use "
                 "troupe run for a single-process job\n";
    return 2;
  }
  if (cfg.cluster->tasks.empty()) {
    std::cerr << "troupe: " << file
              << ": cluster.tasks: missing; troupe launch starts the tasks a cluster spec lists "
                 "(a cluster from the environment is started by its launcher: torchrun, "
                 "Kubernetes, srun)\n";
    return 2;
  }
  auto children = node_children(*cfg.cluster, file, opts);
  apply_failure_policy(children, cfg);
  bool survivable = false;
  std::string why_not;
  for (const auto& c : children) {
    survivable = survivable || c.survivable;
    if (why_not.empty()) why_not = c.why_fatal;
  }
  if (opts.restart_workers > 0 && !survivable)
    std::cerr << "troupe launch: --restart-workers has no effect: the job cannot lose any task"
              << (why_not.empty() ? "" : " (" + why_not + ")") << "\n";
  // Every task runs here, so a secret made up now serves them all; it reaches
  // them through the environment, never the command line.
  const auto& spec = *cfg.cluster;
  const char* given = std::getenv(spec.secret_env.c_str());
  if (spec.secret_file.empty() && (!given || !*given)) {
    auto secret = make_challenge();
    for (auto& c : children) c.env.push_back(spec.secret_env + "=" + secret);
    std::cerr << "troupe launch: $" << spec.secret_env
              << " is not set: the tasks share a secret made up for this launch\n";
  }
  std::string names;
  for (const auto& c : children) {
    if (!names.empty()) names += ", ";
    names += c.name + " (" + task_address(*cfg.cluster, parse_task_name(c.name)) + ")";
  }
  std::cerr << "troupe launch: starting " << children.size() << " tasks: " << names << "\n";
  std::cerr.flush();
  std::cout.flush();
  supervise_options so;
  so.restart_workers = opts.restart_workers;
  // A task asked to stop while training takes up to cluster.grace_seconds to
  // leave with its checkpoint; SIGKILL only after that.
  so.signal_grace_seconds = spec.grace_seconds + 5;
  so.log_starts = true;
  std::optional<job_authority> ca;
  if (uses_job_ca(spec) && !issue_from_job_ca(ca, so)) return 1;
  return supervise(children, so);
}

}  // namespace troupe::launch
