#pragma once
// The cluster from the environment: `troupe node --config FILE` without
// --task and without cluster.tasks learns its rank, the world size and the
// chief's address from the variables a launcher sets, in this order of
// precedence (the first set whose rank variable is present wins):
//   troupe's own    TROUPE_RANK, TROUPE_WORLD_SIZE, TROUPE_CHIEF (host:port)
//   torchrun and    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Kubeflow's PyTorchJob
//   SLURM (srun)    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST,
//                   SLURM_JOB_ID: the chief on the first host of the node
//                   list, at TROUPE_CHIEF_PORT, else cluster.port, else a
//                   port derived from the job id (slurm_chief_port).
// Rank 0 is the chief; ranks 1..P are ps:0..P-1 (P = cluster.roles.ps), the
// rest worker:0.. (role_of_rank). Each rank listens at TROUPE_ADVERTISE_ADDR
// (else SLURMD_NODENAME under SLURM, else the host name) on TROUPE_PORT (else
// a port the OS picks); the chief listens at its own address. The ranks meet
// at the chief (net/rendezvous.hpp) to learn each other's addresses.
//
// Everything here is pure (an environment map in, the resolution out), so
// every flavour and error is tested without touching the real environment.
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config/cluster.hpp"

namespace troupe {

// A bad or missing variable; what() names it and its value, e.g.
// `RANK: expected an integer in 0..WORLD_SIZE-1 (0..2), got "x"`.
class cluster_env_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

using environment_map = std::map<std::string, std::string>;

// This process's environment as a map (the one impure function here).
environment_map process_environment();

// True when the environment names a rank in any of the three flavours.
bool environment_has_cluster(const environment_map& env);

// SLURM's compressed host list, expanded in order, zero padding kept:
// "node[01-03,07]" -> node01 node02 node03 node07; "a[1-2],b3" -> a1 a2 b3;
// "x[1-2]-y[3-4]" -> x1-y3 x1-y4 x2-y3 x2-y4. Throws std::invalid_argument
// naming what is wrong (an unclosed bracket, a descending range, ...).
std::vector<std::string> expand_hostlist(std::string_view list);

// The chief's port under SLURM when none is given: 20000 + job id mod
// 12000, i.e. unprivileged and below Linux's ephemeral range (32768..), so
// no OS-chosen port of the job's own ranks can take it.
uint16_t slurm_chief_port(uint64_t job_id);

// rank -> task: 0 -> chief:0, 1..ps -> ps:0..ps-1, the rest worker:0...
task_id role_of_rank(int64_t rank, int64_t ps_ranks);

// The tasks map of a cluster whose rank r listens at addresses[r].
std::map<std::string, std::vector<std::string>> tasks_of_ranks(
    const std::vector<std::string>& addresses, int64_t ps_ranks);

struct cluster_env {
  std::string source;  // "TROUPE_RANK", "RANK" or "SLURM_PROCID": the flavour found
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = -1;  // SLURM_LOCALID or LOCAL_RANK when given
  std::string chief;        // host:port
  task_id task;             // this rank's role
  // Where this rank listens (the chief: its own address).
  std::string advertise_host;
  uint16_t listen_port = 0;  // 0: one the OS picks
};

// Resolves the environment against the config's cluster section
// (roles, port). `host_name` is the machine's name, the last resort for the
// advertised host. Throws cluster_env_error naming the variable, or
// config_error for cluster.roles that do not fit the world size.
cluster_env resolve_cluster_env(const environment_map& env, const cluster_spec& spec,
                                const std::string& host_name);

}  // namespace troupe
