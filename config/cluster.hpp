#pragma once
// The cluster spec of a multi-process job: which processes ("tasks") it runs,
// where each listens, and which actors each hosts. Modelled on TF_CONFIG's
// cluster spec: named jobs ("chief", "worker", "ps"), each a list of
// "host:port" addresses; a task is "job:index", e.g. "worker:1".
//
// The JSON (key "cluster" of a job; see config/schema.cpp for the reader):
//   "cluster": {
//     "tasks": {"chief": ["127.0.0.1:7000"],
//               "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
//               "ps": ["127.0.0.1:7003"]},
//     "hosts": {"worker:0": {"replicas": [0], "devices": ["cpu:0"]}, ...},  // optional
//     "join_timeout_seconds": 30, "heartbeat_seconds": 1, "grace_seconds": 25,
//     "roles": {"ps": 1}, "port": 29500,  // the cluster from the environment only
//     "secret_env": "TROUPE_SECRET", "secret_file": "",
//     "tls": {"ca": "ca.pem", "cert": "worker0.pem", "key": "worker0.key"},  // optional
//     "insecure": false, "max_message_mb": 512,                               // optional
//     "identity": "job_ca"}  // or "shared_secret"; the environment's cluster or troupe launch
//
// Default placement (no "hosts"); the chief always runs the coordinator, and
// the strategy's rules (config/strategy_rules.hpp) say whether there are
// variable shards and which jobs the cluster needs:
//   one_device        the replica on worker:0, or on the chief without workers
//   mirrored,         replicas 0..R-1 in contiguous blocks over the worker tasks
//   central_storage   (the first R % W workers get one more), or all on the
//                     chief without workers; central_storage's shards go to the
//                     ps tasks in contiguous blocks, or to the chief without ps
//   parameter_server  workers 0..R-1 over the worker tasks, shards 0..S-1 over
//                     the ps tasks, both in contiguous blocks; needs both jobs
// A replica's device is devices[r % devices.size()] of the job. An explicit
// "hosts" replaces the defaults entirely: tasks it does not name host nothing
// (but the chief still coordinates), and every replica and shard must be
// placed exactly once.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

struct job_config;

// The job names a cluster may use, in the order tasks are listed.
const std::vector<std::string>& cluster_job_names();  // {"chief", "worker", "ps"}

// One task: a job name and an index into that job's addresses.
struct task_id {
  std::string job;
  int64_t index = 0;
  std::string str() const;  // "worker:1"
  friend bool operator==(const task_id&, const task_id&) = default;
};

// What one task hosts, as given in "hosts".
struct task_hosts {
  std::vector<int64_t> replicas;     // replica (parameter_server: worker) indices
  std::vector<std::string> devices;  // devices[k] runs replicas[k]; empty = the default
  std::vector<int64_t> shards;       // variable shard indices
};

struct cluster_spec {
  // job name -> addresses ("host:port"); task job:i listens on tasks[job][i].
  // Empty: the cluster comes from the environment (config/cluster_env.hpp)
  // and the rendezvous at the chief fills it in (net/rendezvous.hpp).
  std::map<std::string, std::vector<std::string>> tasks;
  // The cluster from the environment: ranks 1..ps_ranks are ps tasks, the
  // rest workers ("roles": {"ps": N}); and the chief's port under SLURM
  // ("port"; 0: derived from SLURM_JOB_ID).
  int64_t ps_ranks = 0;
  uint16_t port = 0;
  // "job:index" -> what it hosts; empty = the default placement above.
  std::map<std::string, task_hosts> hosts;
  // The chief waits this long for every task (and, from the environment,
  // every rank retries joining the chief this long).
  double join_timeout_seconds = 30;
  double heartbeat_seconds = 1;  // between peers; a hung peer is detected from it
  // After SIGTERM/SIGUSR1 (runtime/preemption.hpp): the checkpoint and the
  // exit within this many seconds, under Kubernetes' default 30 s.
  double grace_seconds = 25;
  // The shared secret (config/secret.hpp): from secret_file when set, else
  // from the environment variable secret_env. Never from the command line.
  std::string secret_env = "TROUPE_SECRET";
  std::string secret_file;
  // Between tasks every connection is TLS 1.3 (net/secure_link.hpp):
  // keyed from the secret (a pre-shared key derived with HKDF) by default, or
  // with mutual certificates from a cluster CA when `tls` names the files
  // (each task's certificate names its task, e.g. CN=worker:1). `insecure`
  // turns encryption off (a warning at every start); never with `tls`.
  struct tls_files {
    std::string ca, cert, key;  // PEM files; all three, or none
  };
  tls_files tls;
  bool insecure = false;
  // Who can speak as a task in a cluster from the environment or of troupe
  // launch, without cluster.tls: "job_ca" (the default) has the chief's
  // rendezvous (or the launcher, net/launch_enrol.hpp) issue each task a
  // certificate naming it from a CA made for this job (net/job_ca.hpp),
  // and the links check them, so the secret only admits a task to ask for
  // its certificate; "shared_secret" keys the links from the secret as a
  // cluster.tasks started by hand does (any holder of the secret can then
  // prove any task's name).
  enum class identity_mode { job_ca, shared_secret };
  identity_mode identity = identity_mode::job_ca;
  // The largest BASP frame a task accepts from an authenticated peer, in MiB;
  // 0: derived from the job's model (net/secure_link.hpp).
  double max_message_mb = 0;
};

struct host_port {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  uint16_t port = 0;
};

// Splits "host:port" (IPv6 as "[::1]:7000"). Throws std::invalid_argument with
// `expected "host:port", got "x"` or `expected "host:port" with a port in
// 1..65535, got "h:0"`.
host_port parse_host_port(std::string_view s);
// The inverse: "host:port", "[::1]:7000" for an IPv6 address.
std::string format_host_port(const std::string& host, uint16_t port);

// "worker:1" -> {"worker", 1}. Throws std::invalid_argument naming what is
// wrong (no ':', an unknown job name, an index that is not a number).
task_id parse_task_name(std::string_view name);

// Every task of the spec in a stable order: chief, worker:0.., ps:0..
std::vector<task_id> all_tasks(const cluster_spec& spec);
bool has_task(const cluster_spec& spec, const task_id& task);
// The task's "host:port"; throws std::out_of_range naming the task when the
// spec has no such task.
const std::string& task_address(const cluster_spec& spec, const task_id& task);

// Where the actors of the job live: one entry per task, in all_tasks order.
struct task_placement {
  task_id task;
  bool coordinator = false;          // the chief
  std::vector<int64_t> replicas;     // replica (parameter_server: worker) indices
  std::vector<std::string> devices;  // devices[k] runs replicas[k]
  std::vector<int64_t> shards;       // variable shard indices
  // Each task with replicas runs an input pipeline reading only its share.
  bool input_pipeline() const { return !replicas.empty(); }
};

// The placement of a job with a cluster (defaults, or the "hosts" override),
// checked against the strategy. Throws config_error naming the JSON path.
std::vector<task_placement> resolve_placement(const job_config& job);
// The entry of `task`; throws std::out_of_range when it has none.
const task_placement& placement_of(const std::vector<task_placement>& placement,
                                   const task_id& task);

// The cluster's rules that involve other fields (a chief, tasks named in
// "hosts" exist, the strategy's task kinds are there, the placement is
// complete). parse_job_config calls it; throws config_error.
void check_cluster(const job_config& job);

}  // namespace troupe
