#pragma once
// `troupe launch`: starts every task of a job's cluster spec as a local child
// process (`troupe node --config FILE --task NAME ...`), as torchrun/mpirun do
// for a laptop or a test, and keeps them with supervise() (cli/supervise.hpp:
// output relayed with task names, signals forwarded, failures, restarts, the
// exit status).
#include <functional>
#include <string>
#include <vector>

#include "cli/supervise.hpp"

namespace troupe {
struct cluster_spec;
struct job_config;
}  // namespace troupe

namespace troupe::launch {

struct launch_options {
  int restart_workers = 0;              // --restart-workers N (supervise_options)
  std::string output_dir;               // forwarded as --output DIR when set
  bool resume = false;                  // forwarded as --resume
  bool overwrite = false;               // forwarded as --overwrite
  std::vector<std::string> extra_args;  // after `--`: appended to every node's arguments
  // The command each task runs, before its arguments; empty = this binary's
  // `node` subcommand (/proc/self/exe node). The environment variable
  // TROUPE_LAUNCH_NODE_CMD, when set, overrides both: a /bin/sh command line
  // that gets the node arguments appended ("$@").
  std::vector<std::string> node_command;
};

// The children for every task of `spec` (all_tasks order), each running
// `<node command> --config FILE --task NAME [--output DIR] [--resume]
// [--overwrite] [extra...]` with TROUPE_TASK=NAME in its environment.
std::vector<child> node_children(const cluster_spec& spec, const std::string& config_file,
                                 const launch_options& opts);

// Marks the chief, and which children the job survives losing: the worker
// tasks that host no variable shards, when the job's strategy goes on
// without a lost worker (strategy_rules::survives_lost_workers); the others
// get `why_fatal`. Children are matched by task name.
void apply_failure_policy(std::vector<child>& children, const job_config& job);

// `troupe launch` from its arguments (after "launch"): exit status 0, 1, or
// 2 (bad usage through `bad_usage`, a bad config, a job without a cluster).
int cmd_launch(const std::vector<std::string>& args,
               const std::function<int(const std::string&)>& bad_usage);

}  // namespace troupe::launch
