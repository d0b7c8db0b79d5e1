// troupe node across real processes on 127.0.0.1 (ports picked free at run
// time): mirrored, central_storage and parameter_server jobs against the same
// job in one process, a worker killed with SIGKILL (by hand and under
// `troupe launch`), and the shared secret.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "actors/net_system_config.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "messages/node_messages.hpp"
#include "net/basp_guard.hpp"
#include "net/chief_enrol.hpp"
#include "net/gate.hpp"
#include "net/job_ca.hpp"
#include "net/socket.hpp"
#include "runtime/job.hpp"
#include "runtime/preemption.hpp"
#include "tests/attack.hpp"
#include "tests/free_port.hpp"
#include "tests/gate_fixtures.hpp"
#include "tests/processes.hpp"
#include "tests/strategy_fixtures.hpp"
#include "tests/tls_fixtures.hpp"

using namespace troupe;
using namespace troupe::test;
namespace fs = std::filesystem;

namespace {

// Starts every task of the cluster, logs in dir/<task>.log; `env`: task ->
// variables set for that task's process only.
node_procs start_all(const cluster_job& job, const std::string& dir,
                     const std::vector<std::string>& extra = {},
                     const std::map<std::string, std::map<std::string, std::string>>& env = {}) {
  node_procs procs;
  for (auto& [task, _] : job.address) {
    auto e = env.find(task);
    procs[task] =
        std::make_unique<node_proc>(job.file, task, dir + "/" + task + ".log", kSecret, extra,
                                    e == env.end() ? decltype(e->second){} : e->second);
  }
  return procs;
}

// Every process must exit 0 within `limit`. None may have sent another a
// message without a sender: the guard drops those (net/basp_guard.hpp),
// so a shutdown or a rendezvous that relied on one would wait.
void wait_all(node_procs& procs, double limit) {
  for (auto& [task, p] : procs) {
    int rc = p->wait(std::chrono::duration<double>(limit));
    CHECK_MESSAGE(rc == 0, task << " exited with " << rc << "; its log:\n" << p->output());
    CHECK_MESSAGE(p->output().find("without a sender") == std::string::npos,
                  task << " dropped a message without a sender; its log:\n"
                       << p->output());
  }
}

// Starts every task of the cluster; all must exit 0 within `limit`.
void run_all(const cluster_job& job, const std::string& dir, std::vector<std::string> extra = {},
             double limit = 120) {
  auto procs = start_all(job, dir, extra);
  wait_all(procs, limit);
}

// A cluster whose links are keyed from the secret (cluster.identity
// "shared_secret"): the attacks on the frame guard, the live-task rule and
// the node handshake play a holder of the secret that gets past TLS, which
// tasks started by hand under the job CA (the default) no longer let it.
void keyed_from_the_secret(cluster_job& job) {
  job.json["cluster"]["identity"] = "shared_secret";
  std::ofstream(job.file) << job.json.dump(2);
}

nlohmann::json summary_in(const std::string& out) {
  return nlohmann::json::parse(read_file(out + "/summary.json"));
}

// The end of a chief-and-worker job attacked while it trained: the attack
// came before the end, both exit 0, and the result is the unattacked job's
// (`one`). Returns the chief's output, for the attack's own log lines.
std::string attacked_job_ends_as(const nlohmann::json& one, const temp_dir& dir, node_proc& chief,
                                 node_proc& worker, const std::string& what) {
  CHECK_MESSAGE(!fs::exists(dir / "out/summary.json"),
                "the attack came after the job had ended: make it longer");
  CHECK_MESSAGE(chief.wait(std::chrono::seconds(120)) == 0, chief.output());
  CHECK_MESSAGE(worker.wait(std::chrono::seconds(60)) == 0, worker.output());
  auto many = summary_in(dir / "out");
  CHECK(many["steps"] == one["steps"]);
  double d = max_abs_diff(variables_of(one), variables_of(many));
  MESSAGE(what << " vs one process: max |diff| " << d);
  CHECK(d < 1e-4);
  return chief.output();
}

// The job the interrupting tests stop and resume: mirrored, 3 replicas over
// 3 processes (chief, worker:0 with replicas 0 and 1, worker:1 with 2), 1000
// steps, a checkpoint every 50.
job_config interruptible_job(strategy_env& env) {
  auto c = env.job("mirrored", "adam", 3, 16);
  c.training.epochs = 8;  // 125 steps an epoch, 1000 in all
  c.checkpoint.every_steps = 50;
  c.checkpoint.keep = 3;
  return c;
}

// The variables of `c`'s uninterrupted run over 3 processes (in dir/whole).
std::vector<named_tensor> uninterrupted_variables(job_config c, const temp_dir& dir) {
  c.logging.output_dir = dir / "whole";
  fs::create_directories(dir / "a");
  cluster_job whole(c, dir / "a", 2, 0);
  run_all(whole, dir / "a");
  return variables_of(summary_in(dir / "whole"));
}

// Waits (up to 60 s) until a running job has written its first checkpoint.
void wait_for_checkpoint(const fs::path& ckpts) {
  auto until = clock_type::now() + std::chrono::seconds(60);
  while (!(fs::exists(ckpts) && !fs::is_empty(ckpts)) && clock_type::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(fs::exists(ckpts));
}

// Runs `c` as a chief, `workers` worker and `ps` ps processes (outputs in
// dir/out); returns the summary.
nlohmann::json run_in_processes(job_config c, const temp_dir& dir, int workers, int ps) {
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), workers, ps);
  run_all(job, dir.str());
  return summary_in(dir / "out");
}

}  // namespace

TEST_CASE("mirrored over 3 processes equals the same job in one process") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 3, 48);
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  temp_dir dir;
  auto many = run_in_processes(c, dir, 2, 0);  // chief, worker:0 (replicas 0, 1), worker:1 (2)
  CHECK(many["steps"] == one["steps"]);
  double d = max_abs_diff(variables_of(one), variables_of(many));
  MESSAGE("mirrored, 3 processes vs 1: max |diff| " << d);
  // The hierarchical group sums in another order than the in-process ring.
  CHECK(d < 2e-5);
  // Executions of 4 steps (training.steps_per_execution): the requests and
  // their answers, one step_stats per step, cross the processes.
  c.training.steps_per_execution = 4;
  temp_dir dir4;
  auto four = run_in_processes(c, dir4, 2, 0);
  CHECK(four["steps"] == one["steps"]);
  CHECK(max_abs_diff(variables_of(many), variables_of(four)) == 0.0);
}

// The cluster from the environment (config/cluster_env.hpp): no --task, no
// cluster.tasks; each process has only its launcher's variables, and the
// ranks meet at the chief (net/rendezvous.hpp).
namespace {

// `c` without cluster.tasks; the job's file.
std::string environment_job_file(const job_config& c, const std::string& dir) {
  auto j = to_json(c);
  j["cluster"] = {{"join_timeout_seconds", 30}, {"heartbeat_seconds", 1}};
  const auto file = dir + "/env_job.json";
  std::ofstream(file) << j.dump(2);
  return file;
}

// Starts rank `rank` with `env` (its launcher's variables) and nothing else.
std::unique_ptr<node_proc> start_rank(const std::string& file, const std::string& dir, int rank,
                                      std::map<std::string, std::string> env) {
  env.emplace("TROUPE_ADVERTISE_ADDR", "127.0.0.1");  // unless the launcher gives one
  const auto name = "rank" + std::to_string(rank);
  return std::make_unique<node_proc>(name, dir + "/" + name + ".log", kSecret,
                                     std::vector<std::string>{TROUPE_BIN, "node", "--config", file},
                                     env);
}

// A 3-replica mirrored job (chief, worker:0 with replicas 0 and 1, worker:1
// with replica 2) started from `env_of(rank)`, ranks in `order` 0.3 s apart,
// rank `late` (if any) `late_by` after the others; it must equal one process.
template <class EnvOf>
void mirrored_from_environment(EnvOf env_of, std::vector<int> order, int late = -1,
                               std::chrono::milliseconds late_by = {}) {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 3, 48);
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  const auto file = environment_job_file(c, dir.str());
  node_procs procs;
  for (int rank : order) {
    if (rank == late) continue;
    procs[std::to_string(rank)] = start_rank(file, dir.str(), rank, env_of(rank));
    // Apart, so that a rank started before the chief finds nobody there yet.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  if (late >= 0) {
    std::this_thread::sleep_for(late_by);
    procs[std::to_string(late)] = start_rank(file, dir.str(), late, env_of(late));
  }
  wait_all(procs, 120);
  // Rank r > 0 is worker:r-1.
  for (int rank : {1, 2})
    CHECK(procs[std::to_string(rank)]->output().find("task worker:" + std::to_string(rank - 1) +
                                                     " finished") != std::string::npos);
  auto many = summary_in(dir / "out");
  CHECK(many["steps"] == one["steps"]);
  double d = max_abs_diff(variables_of(one), variables_of(many));
  MESSAGE("mirrored from the environment, 3 processes vs 1: max |diff| " << d);
  CHECK(d < 2e-5);
}

}  // namespace

TEST_CASE("mirrored over 3 processes from torchrun's variables, ranks in reverse order") {
  const auto port = std::to_string(free_port());
  mirrored_from_environment(
      [&](int rank) {
        return std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                                  {"WORLD_SIZE", "3"},
                                                  {"MASTER_ADDR", "127.0.0.1"},
                                                  {"MASTER_PORT", port}};
      },
      {2, 1, 0});
}

// What a Kubeflow PyTorchJob pod sees: the training operator's variables
// (kubeflow/training-operator, pkg/controller.v1/pytorch/envvar.go,
// setPodEnv: PYTHONUNBUFFERED, then MASTER_ADDR = "<job>-master-0" and
// MASTER_PORT = the master container's "pytorchjob-port", WORLD_SIZE = all
// replicas, RANK = the replica index, plus 1 for workers) and those our
// deploy/kubernetes/pytorchjob.yaml adds (TROUPE_ADVERTISE_ADDR = the pod's
// IP, TROUPE_PORT = the same port in every pod). Each pod has its own
// address: 127.0.0.<1 + rank> here. The master's Service name does not
// resolve outside a cluster, so "localhost" (a name, resolved like it)
// stands for it.
std::map<std::string, std::string> kubeflow_pod_env(const std::string& type, int index, int workers,
                                                    const std::string& master_port,
                                                    const std::string& troupe_port) {
  const int rank = type == "worker" ? index + 1 : index;
  return {{"PYTHONUNBUFFERED", "0"},
          {"MASTER_ADDR", "localhost"},
          {"MASTER_PORT", master_port},
          {"WORLD_SIZE", std::to_string(1 + workers)},
          {"RANK", std::to_string(rank)},
          {"TROUPE_ADVERTISE_ADDR", "127.0.0." + std::to_string(1 + rank)},
          {"TROUPE_PORT", troupe_port}};
}

TEST_CASE("mirrored over 3 processes as Kubeflow's PyTorchJob starts them, workers first") {
  const auto master_port = std::to_string(free_port());
  const auto troupe_port = std::to_string(free_port());
  mirrored_from_environment(
      [&](int rank) {
        return rank == 0 ? kubeflow_pod_env("master", 0, 2, master_port, troupe_port)
                         : kubeflow_pod_env("worker", rank - 1, 2, master_port, troupe_port);
      },
      {1, 2, 0});
}

TEST_CASE("mirrored over 3 processes from SLURM's variables, one rank 10 s late") {
  const auto port = std::to_string(free_port());
  mirrored_from_environment(
      [&](int rank) {
        return std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(rank)},
                                                  {"SLURM_NTASKS", "3"},
                                                  {"SLURM_LOCALID", std::to_string(rank)},
                                                  {"SLURM_JOB_NODELIST", "127.0.0.1"},
                                                  {"SLURM_JOB_ID", "4242"},
                                                  {"TROUPE_CHIEF_PORT", port}};
      },
      {0, 1, 2}, 1, std::chrono::seconds(10));
}

// Issue 40, row 1 under the job CA (cluster.identity "job_ca", the default
// for a cluster from the environment): a holder of the secret proves the
// key as chief:0 (never live at the chief itself), but the gate asks for a
// certificate of the job CA and refuses it, logged, whether it sends none or
// a chief:0 certificate of a CA of its own; worker:0, live, is refused at
// the gate. No TLS state is made for any of them, and the real job
// finishes with one process's result.
TEST_CASE("a job from the environment: the secret alone speaks as no task; refused, logged, done") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 2, 48);
  c.training.epochs = 4000;  // the attack comes while it trains
  c.checkpoint.every_steps = 0;
  c.logging.level = "info";  // the links' kind is said at info
  auto one = run_job(c);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  const auto file = environment_job_file(c, dir.str());
  const auto port = free_port();
  auto env_of = [&](int rank) {
    return std::map<std::string, std::string>{
        {"TROUPE_RANK", std::to_string(rank)},
        {"TROUPE_WORLD_SIZE", "2"},
        {"TROUPE_CHIEF", "127.0.0.1:" + std::to_string(port)}};
  };
  auto chief = start_rank(file, dir.str(), 0, env_of(0));
  auto worker = start_rank(file, dir.str(), 1, env_of(1));
  REQUIRE_MESSAGE(file_shows(dir / "out/metrics.jsonl", "\"step\""), chief->output());
  const job_authority rogue;
  const auto forged = rogue.issue_self("chief:0");
  for (const auto& [as, id] : std::vector<std::pair<std::string, const task_identity*>>{
           {"worker:0", nullptr}, {"chief:0", nullptr}, {"chief:0", &forged}}) {
    // Waiting longer than the chief's 5 s for a certificate, so that the
    // chief is the one to give up.
    auto s = handshake_with_chief(port, kSecret, as, id, std::chrono::seconds(8));
    CHECK_MESSAGE(s.fd < 0, as);
    if (s.fd >= 0) ::close(s.fd);
    // The gate logs at most one refusal a second.
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  }
  CHECK_MESSAGE(!fs::exists(dir / "out/summary.json"),
                "the attack came after the job had ended: make it longer");
  node_procs procs;
  procs["0"] = std::move(chief);
  procs["1"] = std::move(worker);
  wait_all(procs, 120);
  const auto log = procs["0"]->output();
  CHECK_MESSAGE(log.find("the certificates the job CA issued") != std::string::npos, log);
  CHECK(log.find("refused a peer claiming to be worker:0") != std::string::npos);
  // The link keyed from the secret sends no certificate; the forged one's is
  // not of the job CA.
  CHECK(log.find("claiming to be chief:0 (127.0.0.1:") != std::string::npos);
  CHECK(log.find("proved the key but sent no certificate within") != std::string::npos);
  CHECK(log.find("its certificate: unable to get local issuer certificate") != std::string::npos);
  CHECK(log.find("chief:0: closed the connection with chief:0") == std::string::npos);
  auto many = summary_in(dir / "out");
  CHECK(many["steps"] == one["steps"]);
  double d = max_abs_diff(variables_of(one), variables_of(many));
  MESSAGE("attacked job from the environment vs one process: max |diff| " << d);
  CHECK(d < 1e-4);
}

// Issue 40 for tasks started by hand (a written-out cluster.tasks, no
// launcher, no rendezvous; cluster.identity "job_ca", the default): the chief
// holds the job CA, worker:0 enrols with it (net/chief_enrol.hpp) and links
// by certificate. While it trains, a holder of the secret asks the chief's
// enrolment door for worker:0's certificate (a live task), and for the
// chief's, and opens a link keyed from the secret as chief:0: each refused
// and logged, and the job ends as an unattacked one.
std::string enrol_error(uint16_t port, const std::string& as) {
  try {
    ::close(chief_enrol::enrol(kSecret, as, "chief:0", "127.0.0.1", port,
                               clock_type::now() + std::chrono::seconds(2))
                .held_fd);
  } catch (const job_ca_error& e) {
    return e.what();
  }
  return "(issued)";
}

TEST_CASE(
    "tasks started by hand enrol with the chief's job CA; a live task's claimant is refused") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 2, 48);
  c.training.epochs = 4000;  // the attack comes while it trains
  c.checkpoint.every_steps = 0;
  c.logging.level = "info";  // the links' kind and the enrolments are said at info
  auto one = run_job(c);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret);
  node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret);
  REQUIRE_MESSAGE(file_shows(dir / "out/metrics.jsonl", "\"step\""), chief.output());
  const auto port = parse_host_port(job.address.at("chief:0")).port;
  auto why = enrol_error(port, "worker:0");
  CHECK_MESSAGE(why.find("worker:0: cannot enrol with chief:0") != std::string::npos, why);
  why = enrol_error(port, "chief:0");
  CHECK_MESSAGE(why.find("the chief's own name is never issued") != std::string::npos, why);
  // The gate asks a link for a certificate: the secret alone gets no verdict.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a refusal logged a second
  auto s = handshake_with_chief(port, kSecret, "chief:0", nullptr, std::chrono::seconds(8));
  CHECK(s.fd < 0);
  if (s.fd >= 0) ::close(s.fd);
  const auto log = attacked_job_ends_as(one, dir, chief, worker, "attacked job started by hand");
  CHECK_MESSAGE(log.find("chief:0: made the job CA in memory") != std::string::npos, log);
  CHECK(log.find("chief:0: enrolment: issued worker:0") != std::string::npos);
  CHECK(log.find("the certificates the job CA issued") != std::string::npos);
  CHECK(log.find("refused a peer claiming to be worker:0") != std::string::npos);
  CHECK(log.find("worker:0 has a live connection here already") != std::string::npos);
  CHECK(log.find("refused a certificate for chief:0") != std::string::npos);
  CHECK(log.find("proved the key but sent no certificate within") != std::string::npos);
  const auto wlog = worker.output();
  CHECK_MESSAGE(wlog.find("worker:0: enrolled with chief:0") != std::string::npos, wlog);
  CHECK(wlog.find("the certificates the job CA issued") != std::string::npos);
}

TEST_CASE(
    "mirrored's device all-reduce over 3 processes (hierarchical, on sim devices) equals one "
    "process") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 3, 48);
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  c.strategy.reducer.algorithm = reducer_algorithm::device;
  c.devices = {"sim:0", "sim:1", "sim:2"};
  temp_dir dir;
  // chief, worker:0 (replicas 0, 1: a device group of 2), worker:1 (replica 2)
  // The processes' sum over their direct links (the default: shared rings,
  // the processes share this host), over TCP with TLS as between hosts, over
  // Unix sockets (waits sleeping at once, yield_us 0), then through the
  // ring nodes: the same ring order, so the same bits.
  c.logging.level = "info";
  auto many = run_in_processes(c, dir, 2, 0);
  CHECK(many["steps"] == one["steps"]);
  double d = max_abs_diff(variables_of(one), variables_of(many));
  MESSAGE("mirrored nccl, 3 processes vs ring in 1: max |diff| " << d);
  CHECK(d < 2e-5);
  auto said = [](const fs::path& log, const std::string& kind, int yield_us = 3000) {
    const auto text = read_file(log);
    CHECK_MESSAGE(text.find("direct links to worker:0 (" + kind + ") and from worker:0 (" + kind +
                            "), fp32 on the wire, a wait yields " + std::to_string(yield_us) +
                            " us") != std::string::npos,
                  text);
  };
  said(dir / "worker:1.log", "shared memory, same host");
  temp_dir dir2;
  c.strategy.reducer.same_host = same_host_link::tcp;
  auto over_tcp = run_in_processes(c, dir2, 2, 0);
  said(dir2 / "worker:1.log", "TLS 1.3 records");
  CHECK(max_abs_diff(variables_of(many), variables_of(over_tcp)) == 0.0);
  temp_dir dir_unix;
  c.strategy.reducer.same_host = same_host_link::unix_socket;
  c.strategy.reducer.yield_us = 0;  // waits sleep at once: the same sums
  auto over_unix = run_in_processes(c, dir_unix, 2, 0);
  said(dir_unix / "worker:1.log", "Unix socket, same host", 0);
  c.strategy.reducer.yield_us = 3000;
  CHECK(max_abs_diff(variables_of(many), variables_of(over_unix)) == 0.0);
  temp_dir dir3;
  c.strategy.reducer.same_host = same_host_link::shared_memory;
  c.strategy.reducer.transport = reducer_transport::actors;
  auto through_actors = run_in_processes(c, dir3, 2, 0);
  CHECK(max_abs_diff(variables_of(many), variables_of(through_actors)) == 0.0);
}

TEST_CASE("mirrored with replicas on the chief too (explicit hosts) equals one process") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 3, 48);
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  job.json["cluster"]["hosts"] = {
      {"chief:0", {{"replicas", {0}}, {"devices", {"cpu:0"}}}},
      {"worker:0", {{"replicas", {1, 2}}, {"devices", {"cpu:1", "cpu:2"}}}}};
  std::ofstream(job.file) << job.json.dump(2);
  run_all(job, dir.str());
  auto many = summary_in(dir / "out");
  double d = max_abs_diff(variables_of(one), variables_of(many));
  MESSAGE("mirrored, chief + 1 worker vs 1 process: max |diff| " << d);
  CHECK(d < 2e-5);
}

TEST_CASE("elastic_average with workers and the center in other processes trains") {
  strategy_env env(960);
  auto c = env.job("elastic_average", "sgd", 2, 32);
  c.strategy.communication_period = 4;
  c.strategy.synchronous = true;
  c.training.epochs = 6;
  c.training.eval_every_epochs = 6;
  temp_dir dir;
  auto s = run_in_processes(c, dir, 2, 1);  // chief, worker:0, worker:1, ps:0 (the center)
  MESSAGE("EASGD over 4 processes: test accuracy " << s["test_accuracy"]);
  CHECK(s["steps"] == 6 * 2 * 15);
  CHECK(s["test_accuracy"].get<double>() > 0.9);
}

TEST_CASE("central_storage with shards and replicas in other processes equals one process") {
  strategy_env env(480);
  auto c = env.job("central_storage", "sgd", 2, 48);
  c.strategy.shards = 2;
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  temp_dir dir;
  auto many = run_in_processes(c, dir, 1, 1);  // chief, worker:0 (both replicas), ps:0 (shards)
  double d = max_abs_diff(variables_of(one), variables_of(many));
  MESSAGE("central_storage, 3 processes vs 1: max |diff| " << d);
  CHECK(d < 2e-5);
}

TEST_CASE("parameter_server with workers and shards in other processes trains like one process") {
  strategy_env env(960);
  auto c = env.job("parameter_server", "adam", 2, 32);
  c.strategy.shards = 2;
  c.training.epochs = 4;
  c.training.eval_every_epochs = 1;
  auto one = run_job(c);
  temp_dir dir;
  auto many = run_in_processes(c, dir, 2, 1);  // chief, worker:0, worker:1, ps:0
  CHECK(many["steps"] == one["steps"]);
  MESSAGE("parameter_server test accuracy: 4 processes "
          << many["test_accuracy"] << ", one process " << one["test_accuracy"]);
  CHECK(many["test_accuracy"].get<double>() > 0.9);
  CHECK(std::abs(many["test_accuracy"].get<double>() - one["test_accuracy"].get<double>()) < 0.05);
}

TEST_CASE(
    "a worker process killed mid-job: mirrored stops naming it, and resumes to the same end") {
  strategy_env env(2000);
  auto c = interruptible_job(env);
  temp_dir dir;
  auto expected = uninterrupted_variables(c, dir);

  c.logging.output_dir = dir / "killed";
  fs::create_directories(dir / "b");
  cluster_job job(c, dir / "b", 2, 0);
  auto procs = start_all(job, dir / "b");
  // Kill worker:1 once the first checkpoint is written.
  wait_for_checkpoint(dir / "killed/checkpoints");
  REQUIRE_MESSAGE(procs["worker:1"]->running(), procs["worker:1"]->output());
  ::kill(procs["worker:1"]->pid, SIGKILL);
  auto killed_at = clock_type::now();
  int rc = procs["chief:0"]->wait(kHangGuard);  // rc 1: it ended on the loss, not the guard
  double took = std::chrono::duration<double>(clock_type::now() - killed_at).count();
  auto out = procs["chief:0"]->output();
  MESSAGE("the chief ended " << took << " s after the SIGKILL");
  CHECK(rc == 1);
  CHECK_MESSAGE(out.find("worker:1") != std::string::npos, out);
  // Said at once, naming the task, before the job's end says why.
  CHECK_MESSAGE(out.find("[warning] chief:0: lost worker:1 (") != std::string::npos, out);
  CHECK(procs["worker:0"]->wait(std::chrono::seconds(10)) != 0);
  procs.clear();
  CHECK_FALSE(fs::exists(dir / "killed/summary.json"));

  // Every task again, with --resume: the same final parameters.
  run_all(job, dir / "b", {"--resume"});
  double d = max_abs_diff(expected, variables_of(summary_in(dir / "killed")));
  MESSAGE("resumed vs uninterrupted: max |diff| " << d);
  CHECK(d < 1e-6);
}

// Sends SIGTERM to `signalled` tasks of a running mirrored job: every
// process must exit with the "resume me" status, leaving a checkpoint and
// the marker (its summary's "preempted" starts with `said`: the first
// signal the chief hears may be its own or a worker's), and the same commands
// started again resume to the uninterrupted run's end. A `late` task is
// held once the chief's stop reached it, and signalled only then (a pod that
// Kubernetes signals after the others): it too must exit 75.
void preempt_and_resume(const std::vector<std::string>& signalled, const std::string& said,
                        const std::string& late = "") {
  strategy_env env(2000);
  auto c = interruptible_job(env);
  temp_dir dir;
  auto expected = uninterrupted_variables(c, dir);

  c.logging.output_dir = dir / "pre";
  fs::create_directories(dir / "b");
  cluster_job job(c, dir / "b", 2, 0);
  std::map<std::string, std::map<std::string, std::string>> held;
  if (!late.empty()) held[late]["TROUPE_TEST_HOLD"] = "leaving:30";
  auto procs = start_all(job, dir / "b", {}, held);
  const fs::path ckpts = dir / "pre/checkpoints";
  wait_for_checkpoint(ckpts);
  for (const auto& task : signalled) {
    auto& p = procs.at(task);
    REQUIRE_MESSAGE(p->running(), task << " ended early; its log:\n" << p->output());
    ::kill(p->pid, SIGTERM);
  }
  if (!late.empty()) {
    auto& p = procs.at(late);
    REQUIRE_MESSAGE(file_shows(p->log, "holding at leaving"), p->output());
    ::kill(p->pid, SIGTERM);
  }
  for (auto& [task, p] : procs) {
    int rc = p->wait(std::chrono::seconds(30));
    CHECK_MESSAGE(rc == preemption::kResumeExitStatus, task << " exited with " << rc
                                                            << "; its log:\n"
                                                            << p->output());
  }
  procs.clear();
  auto s = summary_in(dir / "pre");
  const std::string preempted = s.value("preempted", "");
  CHECK_MESSAGE(preempted.rfind(said, 0) == 0, "preempted by '" << preempted << "'");
  const int64_t stopped_at = s["steps"];
  CHECK(stopped_at < 1000);
  REQUIRE(fs::exists(ckpts / "preempted.json"));
  CHECK(nlohmann::json::parse(read_file(ckpts / "preempted.json"))["step"] == stopped_at);

  // The same commands again (no --resume): the marker resumes the job.
  run_all(job, dir / "b");
  auto again = summary_in(dir / "pre");
  CHECK(again["steps"] == 1000);
  CHECK(again["steps_this_run"] == 1000 - stopped_at);
  CHECK_FALSE(fs::exists(ckpts / "preempted.json"));
  double d = max_abs_diff(expected, variables_of(again));
  MESSAGE("preempted and resumed vs uninterrupted: max |diff| " << d);
  CHECK(d < 1e-6);
}

TEST_CASE(
    "SIGTERM to every process of a mirrored job: a checkpoint, status 75, and the same commands "
    "resume to the same end") {
  // What Kubernetes and scancel --signal=TERM do: every process at once.
  preempt_and_resume({"chief:0", "worker:0", "worker:1"}, "SIGTERM");
}

TEST_CASE(
    "SIGTERM to one worker process of a mirrored job (one evicted pod): the chief stops the whole "
    "job with a checkpoint, every process exits 75, and they resume to the same end") {
  // worker:0 hears its own SIGTERM only after the chief's stop reached it.
  preempt_and_resume({"worker:1"}, "SIGTERM to worker:1", "worker:0");
}

TEST_CASE("actor_learner with its rl_actors in another process solves CartPole") {
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_impala.json");
  c.logging.level = "warn";
  temp_dir dir;
  auto s = run_in_processes(c, dir, 1, 0);
  CHECK(s["strategy"] == "actor_learner");
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["actors_live"] == 2);
}

TEST_CASE("a population with its rl_actors in another process solves CartPole") {
  // Each member's rl_actor sends its unrolls to its member's queue in the
  // chief's process and gets its member's weights; the controller, the
  // queues and the learners stay in the chief's.
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_impala.json");
  c.logging.level = "warn";
  c.rl.population.size = 2;
  c.rl.population.interval_env_steps = 20000;
  temp_dir dir;
  auto s = run_in_processes(c, dir, 1, 0);
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["actors_live"] == 2);
  REQUIRE(s.contains("population"));
  CHECK(s["population"]["members"].size() == 2);
}

TEST_CASE("a native plugin env with its rl_actors in another process solves CartPole") {
  // The worker's process loads the library the config names (the build's
  // plugin directory has it) and steps its envs there.
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_plugin.json");
  c.logging.level = "warn";
  REQUIRE(c.rl.plugin);
  temp_dir dir;
  auto s = run_in_processes(c, dir, 1, 0);
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["actors_live"] == 2);
}

TEST_CASE("central inference with its rl_actors in another process solves CartPole") {
  // Observations and actions cross between the processes; weights stay in
  // the chief's, with the learner and the inference server.
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_central.json");
  c.logging.level = "warn";
  temp_dir dir;
  auto s = run_in_processes(c, dir, 1, 0);
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["actors_live"] == 2);
}

TEST_CASE("Ape-X with its rl_actors in another process solves CartPole, local and central") {
  // Transitions with their priorities cross to the replay shards in the
  // chief's process; with central inference, observations, epsilons and
  // the bootstrap requests cross to the server too.
  for (const char* example : {"cartpole_apex.json", "cartpole_apex_central.json"}) {
    CAPTURE(example);
    auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/" + example);
    c.logging.level = "warn";
    temp_dir dir;
    auto s = run_in_processes(c, dir, 1, 0);
    CHECK(s["solved"] == true);
    CHECK(s["mean_return_100"].get<double>() >= 475);
    CHECK(s["actors_live"] == c.rl.actors);
  }
}

namespace {

// Kills worker:1's process (rl_actor 1) of `example` mid-job and starts it
// again: the job goes on without the actor, takes it back, and runs to
// `env_steps`.
void kill_and_restart_actor_process(const std::string& example, int64_t env_steps) {
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/" + example);
  c.rl.envs_per_actor = 8;  // slower: time to restart the process
  c.training = {};
  c.training.max_env_steps = env_steps;
  c.logging.level = "info";
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 2, 0);
  auto procs = start_all(job, dir.str());
  auto metrics = dir / "out/metrics.jsonl";
  auto wait_for = [&](const std::string& text) { return file_shows(metrics, text); };
  REQUIRE(wait_for("\"train\""));
  REQUIRE(procs["worker:1"]->running());
  ::kill(procs["worker:1"]->pid, SIGKILL);
  CHECK(procs["worker:1"]->wait(std::chrono::seconds(5)) == -SIGKILL);
  REQUIRE(wait_for("\"actor_lost\""));
  procs["worker:1"] =
      std::make_unique<node_proc>(job.file, "worker:1", dir / "worker1-again.log", kSecret);
  for (auto t : {"chief:0", "worker:0", "worker:1"}) {
    int rc = procs[t]->wait(std::chrono::seconds(120));
    CHECK_MESSAGE(rc == 0, t << " exited with " << rc << "; its log:\n" << procs[t]->output());
  }
  auto s = summary_in(dir / "out");
  CHECK(s["env_steps"].get<int64_t>() >= env_steps);
  CHECK(s["actors_live"] == 2);
  auto lost = metrics_of(s, "actor_lost");
  REQUIRE(lost.size() == 1);
  CHECK(lost[0]["actor"] == 1);
  auto back = metrics_of(s, "actor_joined");
  REQUIRE(back.size() == 1);
  CHECK(back[0]["actor"] == 1);
  CHECK(back[0]["step"].get<int64_t>() >= lost[0]["step"].get<int64_t>());
}

}  // namespace

TEST_CASE("an rl_actor process killed mid-job: the learners go on, and take it back") {
  kill_and_restart_actor_process("cartpole_impala.json", 1500000);
}

TEST_CASE("central inference: an rl_actor process killed mid-job is dropped and taken back") {
  // The server stops waiting for the dead process's actor and serves the
  // restarted one from a new sampling stream.
  kill_and_restart_actor_process("cartpole_central.json", 600000);
}

TEST_CASE("a hung worker process (SIGSTOP) is detected by the heartbeats") {
  strategy_env env(2000);
  auto c = env.job("mirrored", "adam", 2, 16);
  c.training.epochs = 20;
  c.checkpoint.every_steps = 50;
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 2, 0);  // heartbeats every 0.5 s: lost after 1.5 s of silence
  auto procs = start_all(job, dir.str());
  fs::path ckpts = dir / "out/checkpoints";
  auto until = clock_type::now() + std::chrono::seconds(60);
  while (!(fs::exists(ckpts) && !fs::is_empty(ckpts)) && clock_type::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(procs["worker:1"]->running());
  ::kill(procs["worker:1"]->pid, SIGSTOP);
  auto stopped_at = clock_type::now();
  // rc 1 within the guard: the heartbeats found it (the mirrored job
  // cannot go on without the stopped worker, so nothing else ends it).
  int rc = procs["chief:0"]->wait(kHangGuard);
  double took = std::chrono::duration<double>(clock_type::now() - stopped_at).count();
  MESSAGE("the chief ended " << took << " s after the SIGSTOP");
  CHECK(rc == 1);
  auto out = procs["chief:0"]->output();
  CHECK_MESSAGE(out.find("worker:1") != std::string::npos, out);
  ::kill(procs["worker:1"]->pid, SIGKILL);
}

TEST_CASE(
    "worker processes killed (SIGKILL) and asked to leave (SIGTERM) mid-job: parameter_server "
    "goes on, and takes them back") {
  strategy_env env(2000);
  auto c = env.job("parameter_server", "adam", 3, 16);
  c.strategy.shards = 1;
  // 42 rounds of 3 pushes an epoch: time to restart the process (and for it
  // to join, TLS included) before the job ends.
  c.training.epochs = 80;
  c.training.eval_every_epochs = 80;
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 3, 1);
  auto procs = start_all(job, dir.str());
  auto metrics = dir / "out/metrics.jsonl";
  auto wait_for = [&](const std::string& text) { return file_shows(metrics, text); };
  REQUIRE_MESSAGE(wait_for("\"push\""), "no push; the chief's log:\n"
                                            << procs["chief:0"]->output());
  REQUIRE(procs["worker:2"]->running());
  ::kill(procs["worker:2"]->pid, SIGKILL);
  CHECK(procs["worker:2"]->wait(std::chrono::seconds(5)) == -SIGKILL);
  REQUIRE(wait_for("\"worker_lost\""));
  // An evicted pod: asked to leave, the worker goes at once (well inside
  // grace_seconds), asking to be started again, and the job goes on.
  REQUIRE(procs["worker:1"]->running());
  ::kill(procs["worker:1"]->pid, SIGTERM);
  CHECK(procs["worker:1"]->wait(std::chrono::seconds(10)) == preemption::kResumeExitStatus);
  REQUIRE(wait_for("\"task\":\"worker:1\""));
  // The same tasks again, as a supervisor would restart them.
  for (auto t : {"worker:1", "worker:2"})
    procs[t] =
        std::make_unique<node_proc>(job.file, t, dir / (std::string(t) + "-again.log"), kSecret);
  for (auto t : {"chief:0", "worker:0", "worker:1", "worker:2", "ps:0"}) {
    int rc = procs[t]->wait(std::chrono::seconds(120));
    CHECK_MESSAGE(rc == 0, t << " exited with " << rc << "; its log:\n" << procs[t]->output());
  }
  auto s = summary_in(dir / "out");
  CHECK(s["steps"] == 80 * 42 * 3);
  CHECK(s["test_accuracy"].get<double>() > 0.9);
  auto lost = metrics_of(s, "worker_lost");
  REQUIRE(lost.size() == 2);
  CHECK(lost[0]["worker"] == 2);
  CHECK(lost[0]["task"] == "worker:2");
  CHECK(lost[1]["worker"] == 1);
  CHECK(lost[1]["task"] == "worker:1");
  auto back = metrics_of(s, "worker_joined");
  REQUIRE(back.size() == 2);
  // Each took steps again: its pushes after it came back.
  std::map<int64_t, int64_t> later;
  std::set<int64_t> is_back;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "worker_joined") is_back.insert(j["worker"].get<int64_t>());
    if (j["type"] == "push" && is_back.count(j["worker"].get<int64_t>()))
      ++later[j["worker"].get<int64_t>()];
  }
  for (const auto& b : back) {
    const int64_t w = b["worker"];
    CHECK((w == 1 || w == 2));
    MESSAGE("worker " << w << ": back at update " << b["step"] << ", " << later[w]
                      << " pushes after");
    CHECK(later[w] > 5);
  }
  CHECK(back[0]["step"].get<int64_t>() >= lost[1]["step"].get<int64_t>());
  CHECK(procs["chief:0"]->output().find("worker:2") != std::string::npos);
}

TEST_CASE("a node whose actor system cannot stop still exits, with the job's code") {
  // The hook holds a shard handle for ever: ~actor_system alone would wait
  // on the shard's thread without end (what CAF 0.17's stranded BASP
  // messages can do).
  strategy_env env(960);
  auto c = env.job("parameter_server", "sgd", 2, 32);
  c.strategy.shards = 1;
  c.training.epochs = 1;
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 2, 1);
  auto procs = start_all(job, dir.str(), {}, {{"ps:0", {{"TROUPE_TEST_HOLD_SHARD_AT_EXIT", "1"}}}});
  wait_all(procs, 60);
  const std::string stuck = "the actor system did not stop within 5 s";
  CHECK(procs["ps:0"]->output().find(stuck) != std::string::npos);
  CHECK(procs["ps:0"]->output().find("task ps:0 finished") != std::string::npos);
  CHECK(procs["chief:0"]->output().find(stuck) == std::string::npos);
  CHECK(summary_in(dir / "out")["steps"].get<int64_t>() > 0);
}

TEST_CASE("a node with a wrong or missing secret is refused") {
  strategy_env env(200);
  auto c = env.job("mirrored", "sgd", 2, 20);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0, /*join_timeout=*/3);
  keyed_from_the_secret(job);
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret);
  {  // A plain CAF client never reaches BASP (the gate, net/gate.hpp).
    net_system_config cfg;
    caf::actor_system sys{cfg};
    auto hp = parse_host_port(job.address.at("chief:0"));
    CHECK_FALSE(sys.middleman().remote_actor<node_actor>(hp.host, hp.port));
    // Past the gate with the secret, a client that skips the node's own
    // handshake can call nothing.
    gate_options g;
    g.secret = kSecret;
    g.name = "worker:0";
    caf::expected<node_actor> h = caf::sec::runtime_error;
    for (int i = 0; i < 100 && !h; ++i) {
      h = gate_remote_actor<node_actor>(sys, hp.host, hp.port, g, std::chrono::seconds(5));
      if (!h) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    REQUIRE(h);
    caf::scoped_actor self{sys};
    std::string err;
    self->request(*h, std::chrono::seconds(5), build_atom::value, node_build{})
        .receive([&](node_parts&) { err = "accepted"; }, [&](caf::error& e) { err = describe(e); });
    CHECK_MESSAGE(err.find("refused: not authenticated") != std::string::npos, err);
    self->request(*h, std::chrono::seconds(5), hello_atom::value, std::string("worker:0"),
                  std::string("00"), std::string("11"))
        .receive([&](std::string&) { err = "accepted"; },
                 [&](caf::error& e) { err = describe(e); });
    CHECK_MESSAGE(err.find("wrong or missing cluster secret") != std::string::npos, err);
  }
  {
    node_proc bad(job.file, "worker:0", dir / "bad.log",
                  "858988d7451b7b4ab7cd20522af617685549e1314acf692f0fb4d1b380ef7194");
    CHECK(bad.wait(std::chrono::seconds(20)) == 1);
    // (Its refusal is not authenticated, as the worker cannot check the
    // chief's MAC without the secret: it retries until its join deadline,
    // then names the refusal.)
    auto out = bad.output();
    CHECK_MESSAGE(out.find("wrong or missing cluster secret") != std::string::npos, out);
  }
  {
    node_proc none(job.file, "worker:0", dir / "none.log", "");
    CHECK(none.wait(std::chrono::seconds(20)) == 2);
    auto out = none.output();
    CHECK_MESSAGE(out.find("TROUPE_SECRET is not set") != std::string::npos, out);
  }
  // Nobody valid joined: the chief gives up at its join timeout, naming who.
  int rc = chief.wait(std::chrono::seconds(20));
  CHECK(rc == 1);
  auto out = chief.output();
  CHECK_MESSAGE(out.find("still waiting for worker:0") != std::string::npos, out);
  CHECK(out.find("refused a peer claiming to be worker:0") != std::string::npos);
}

// Resident memory of process `pid`, in MB (VmRSS).
long rss_mb_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6)) / 1024;
  return 0;
}

// The listening TCP sockets process `pid` holds (from /proc: its socket
// descriptors against the kernel's LISTEN table).
int listening_sockets_of(pid_t pid) {
  std::set<std::string> inodes;
  for (const auto* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A") inodes.insert(inode);
    }
  }
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    auto target = fs::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0 && inodes.count(target.substr(8, target.size() - 9)) > 0)
      ++n;
  }
  return n;
}

// What keeps hitting a port until stopped: random bytes, half-open
// connections, and a holder of the secret that authenticates (gate and
// TLS), sends a valid BASP handshake, then a header announcing 4 GiB.
struct continuous_attack {
  uint16_t port;
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0}, authenticated{0}, cut_off{0};
  std::thread thread;
  explicit continuous_attack(uint16_t p) : port(p) {
    thread = std::thread([this] { run(); });
  }
  ~continuous_attack() {
    stop = true;
    thread.join();
  }
  // A connection, or -1 (the chief may be gone: no REQUIRE off the test's
  // thread).
  int try_connect() const {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
  }
  void run() {
    std::mt19937 rng(11);
    std::deque<int> half_open;
    gate_options o;
    o.secret = kSecret;
    o.name = "worker:0";
    while (!stop) {
      if (int fd = try_connect(); fd >= 0) {
        std::string junk(rng() % 2048 + 1, '\0');
        for (auto& ch : junk) ch = static_cast<char>(rng());
        (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
        ::close(fd);
      }
      if (int fd = try_connect(); fd >= 0) half_open.push_back(fd);
      if (half_open.size() > 20) {
        ::close(half_open.front());
        half_open.pop_front();
      }
      auto s = gate_secure_handshake("127.0.0.1", port, o, std::chrono::seconds(2));
      if (s.fd >= 0) {
        ++authenticated;
        caf::node_id::default_data::host_id_type host{};
        host[0] = static_cast<uint8_t>(rng());
        host[1] = static_cast<uint8_t>(rounds.load());
        auto node = serialized_node_id(caf::make_node_id(rng(), host));
        auto frames = attack::basp_header(1, 0, static_cast<uint32_t>(node.size())) +
                      std::string(node.begin(), node.end()) +
                      attack::basp_header(2, 0, 0xfffffff0u);
        (void)net::send_all(s.fd, frames, clock_type::now() + std::chrono::milliseconds(500));
        // The chief, not this end, closes the connection.
        if (attack::closed_within(s.fd, std::chrono::seconds(3))) ++cut_off;
        ::close(s.fd);
      }
      ++rounds;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (int fd : half_open) ::close(fd);
  }
};

TEST_CASE("a chief attacked at its port stays small, gives nothing away, and finishes its job") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 2, 48);
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  keyed_from_the_secret(job);
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret);
  const auto port = parse_host_port(job.address.at("chief:0")).port;
  REQUIRE_MESSAGE(attack::wait_listening(port, std::chrono::seconds(30)), chief.output());
  // One socket listens: the gate's (CAF never listens; TLS runs on the
  // gate's connections).
  CHECK(listening_sockets_of(chief.pid) == 1);
  const long before = rss_mb_of(chief.pid);
  // Before BASP had a gate: 4 GiB allocated per header, GBs for random
  // bytes, and the forged handshake took the worker's routes.
  auto fds = attack::flood(port, 4, 300);
  long peak = 0;
  for (int i = 0; i < 20; ++i) {
    peak = std::max(peak, rss_mb_of(chief.pid));
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  // From here until the job ends the attack goes on, an authenticated
  // attacker among it; the worker joins during it.
  continuous_attack ongoing(port);
  const auto attack_start = clock_type::now();
  REQUIRE_MESSAGE(attack::eventually([&] { return ongoing.authenticated.load() >= 3; },
                                     std::chrono::seconds(20)),
                  "rounds " << ongoing.rounds.load() << "; " << chief.output());
  MESSAGE("3 authenticated attacks in "
          << std::chrono::duration<double>(clock_type::now() - attack_start).count() << " s");
  node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret);
  auto got = attack::forged_handshake(port);
  CHECK(got.size() == gate_wire::kHelloBytes);  // the gate's hello, then the close
  while (worker.running() && chief.running()) {
    peak = std::max(peak, rss_mb_of(chief.pid));
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  for (int fd : fds) ::close(fd);
  CHECK_MESSAGE(chief.wait(std::chrono::seconds(60)) == 0, chief.output());
  CHECK_MESSAGE(worker.wait(std::chrono::seconds(60)) == 0, worker.output());
  MESSAGE("chief RSS " << before << " MB before the attack, at most " << peak
                       << " MB during it; attack rounds " << ongoing.rounds.load() << ", "
                       << ongoing.authenticated.load() << " authenticated, "
                       << ongoing.cut_off.load() << " cut off by the chief");
  CHECK(peak - before < 100);
  CHECK(ongoing.authenticated > 0);
  CHECK(ongoing.cut_off == ongoing.authenticated);
  CHECK(chief.output().find("refused a connection from 127.0.0.1") != std::string::npos);
  CHECK(chief.output().find("over this job's cap") != std::string::npos);
  // The job is the one the attack did not touch.
  double d = max_abs_diff(variables_of(one), variables_of(summary_in(dir / "out")));
  CHECK(d < 2e-5);
}

// The node id a task's BASP announces in its first frame (a server
// handshake: header, then the node id) to a holder of the secret that
// passes its gate (as the task itself: never connected there).
caf::node_id announced_node_id(uint16_t port) {
  gate_options o;
  o.secret = kSecret;
  o.name = "worker:0";
  auto s = gate_secure_handshake("127.0.0.1", port, o, std::chrono::seconds(5));
  REQUIRE_MESSAGE(s.fd >= 0, s.error);
  const auto deadline = clock_type::now() + std::chrono::seconds(5);
  std::string why, header(32, '\0');
  REQUIRE_MESSAGE(net::recv_exact(s.fd, header, deadline, &why), why);
  uint32_t len = 0;
  for (int i = 4; i < 8; ++i) len = (len << 8) | static_cast<uint8_t>(header[i]);
  REQUIRE(len < (1u << 20));
  std::string payload(len, '\0');
  REQUIRE_MESSAGE(net::recv_exact(s.fd, payload, deadline, &why), why);
  ::close(s.fd);
  caf::binary_deserializer source{static_cast<caf::execution_unit*>(nullptr), payload.data(),
                                  payload.size()};
  caf::node_id node;
  CHECK_FALSE(source(node));
  return node;
}

// Issue 40, row 1, as a job: while worker:0 trains, a holder of the secret on
// loopback passes the chief's gate as worker:0 (the pre-shared key's identity
// is a name it claims), then as chief:0 (a task of the cluster with no live
// connection there), and each time claims worker:0's node id with CAF's
// select-connection flag. Before the fix the chief's traffic for worker:0
// went to the attacker and the job stalled with nothing logged.
TEST_CASE("a holder of the secret cannot take a live worker's routes; refused, logged, job done") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 2, 48);
  c.training.epochs = 800;  // seconds: the attack comes while it trains
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  keyed_from_the_secret(job);
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret);
  node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret);
  REQUIRE_MESSAGE(file_shows(dir / "out/metrics.jsonl", "\"step\""), chief.output());
  // worker:0's node id, as its BASP announces it to anyone past its gate.
  const auto victim =
      serialized_node_id(announced_node_id(parse_host_port(job.address.at("worker:0")).port));
  REQUIRE(!victim.empty());
  const auto port = parse_host_port(job.address.at("chief:0")).port;
  int admitted = 0;
  for (const char* as : {"worker:0", "chief:0"}) {
    auto s = handshake_with_chief(port, kSecret, as);
    if (s.fd < 0) continue;  // refused at the gate
    ++admitted;
    const auto forged = attack::basp_header(1, 0x02, static_cast<uint32_t>(victim.size())) +
                        std::string(victim.begin(), victim.end());
    CHECK(net::send_all(s.fd, forged, clock_type::now() + std::chrono::seconds(2)));
    CHECK(attack::closed_within(s.fd, std::chrono::seconds(3)));  // the chief closed it
    ::close(s.fd);
  }
  CHECK(admitted == 1);  // as chief:0 only: worker:0 is live
  const auto log = attacked_job_ends_as(one, dir, chief, worker, "attacked job");
  CHECK_MESSAGE(log.find("refused a peer claiming to be worker:0") != std::string::npos, log);
  CHECK(log.find("worker:0 has a live connection here already") != std::string::npos);
  CHECK(log.find("closed the connection with chief:0") != std::string::npos);
  CHECK(log.find("claims the node id of worker:0") != std::string::npos);
}

// Issue 40, row 2: a holder of the secret keeps trying 14 links to the chief,
// each past the gate and TLS as chief:0 (a task of the cluster that is never
// live there), a BASP handshake with a node id of its own, then a
// direct_message announcing a frame just under the job's cap whose bytes
// only trickle in. A link the chief closes, or refuses, is tried again.
struct unfinished_flood {
  uint16_t port;
  uint32_t announce;  // the payload length each frame announces
  std::atomic<bool> stop{false};
  std::atomic<int> authenticated{0}, cut_off{0};
  std::thread thread;
  unfinished_flood(uint16_t p, uint32_t bytes) : port(p), announce(bytes) {
    thread = std::thread([this] { run(); });
  }
  ~unfinished_flood() {
    stop = true;
    thread.join();
  }
  // A link that announced its frame, or -1 (refused: the chief may be gone).
  int open_one(std::mt19937& rng) {
    auto s = handshake_with_chief(port, kSecret, "chief:0", nullptr, std::chrono::seconds(2));
    if (s.fd < 0) return -1;
    ++authenticated;
    caf::node_id::default_data::host_id_type host{};
    for (auto& b : host) b = static_cast<uint8_t>(rng());
    auto node = serialized_node_id(caf::make_node_id(rng(), host));
    auto message = attack::basp_header(2, 0, announce);
    message[31] = 1;  // to actor 1: BASP closes a direct_message to no actor
    auto frames = attack::basp_header(1, 0, static_cast<uint32_t>(node.size())) +
                  std::string(node.begin(), node.end()) + message;
    (void)net::send_all(s.fd, frames, clock_type::now() + std::chrono::milliseconds(500));
    return s.fd;
  }
  // 4 KiB more of each frame on every link still open; a closed one is
  // counted and opened again.
  void trickle(std::vector<int>& fds, std::mt19937& rng) {
    const std::string bytes(4096, 'x');
    for (auto& fd : fds) {
      if (fd >= 0 && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
          errno != EAGAIN) {
        ++cut_off;
        ::close(fd);
        fd = -1;
      }
      if (fd < 0 && !stop) fd = open_one(rng);
    }
  }
  void run() {
    std::mt19937 rng(23);
    std::vector<int> fds(14, -1);
    while (!stop) {
      trickle(fds, rng);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
};

TEST_CASE("a chief flooded with unfinished frames just under the cap stays small and finishes") {
  strategy_env env(480);
  auto c = env.job("mirrored", "adam", 2, 48);
  c.training.epochs = 1000;  // a few seconds: the flood goes on while it trains
  c.checkpoint.every_steps = 0;
  auto one = run_job(c);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  // A cap the job may well ask for: 192 MiB a frame.
  job.json["cluster"]["max_message_mb"] = 192;
  keyed_from_the_secret(job);
  // Under ASan freed memory waits in a quarantine (256 MB by default) and
  // would count as the chief's: keep it small, so RSS shows what is held.
  std::map<std::string, std::string> chief_env;
#if defined(__SANITIZE_ADDRESS__)
  const char* asan = std::getenv("ASAN_OPTIONS");
  chief_env["ASAN_OPTIONS"] = std::string(asan ? asan : "") + ":quarantine_size_mb=8";
#endif
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret, {}, chief_env);
  const auto port = parse_host_port(job.address.at("chief:0")).port;
  REQUIRE_MESSAGE(attack::wait_listening(port, std::chrono::seconds(30)), chief.output());
  const long before = rss_mb_of(chief.pid);
  long peak = before;
  {
    unfinished_flood flood(port, (192u << 20) - 4096);
    REQUIRE_MESSAGE(attack::eventually([&] { return flood.authenticated.load() >= 1; },
                                       std::chrono::seconds(20)),
                    chief.output());
    for (int i = 0; i < 40; ++i) {  // the frames' headers are in
      peak = std::max(peak, rss_mb_of(chief.pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret);
    while (worker.running() && chief.running()) {
      peak = std::max(peak, rss_mb_of(chief.pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    CHECK_MESSAGE(worker.wait(std::chrono::seconds(60)) == 0, worker.output());
    MESSAGE("chief RSS " << before << " MB before the flood, at most " << peak << " MB during it; "
                         << flood.authenticated.load() << " links past the gate and TLS, "
                         << flood.cut_off.load() << " cut off by the chief");
  }
  CHECK_MESSAGE(chief.wait(std::chrono::seconds(60)) == 0, chief.output());
  // Before the guard held frames until whole: 174 -> 370 MB (CAF zero-filled
  // 192 MiB for the header).
  // The issue's bound, 100 MB over the baseline, holds in release; ASan's
  // redzones and shadow add to every frame held, so it gets half again.
#if defined(__SANITIZE_ADDRESS__)
  CHECK(peak - before < 150);
#else
  CHECK(peak - before < 100);
#endif
  auto many = summary_in(dir / "out");
  CHECK(many["steps"] == one["steps"]);
  CHECK(max_abs_diff(variables_of(one), variables_of(many)) < 1e-4);
}

TEST_CASE("a chief whose gate fails mid-job ends with the error, and so does its worker") {
  strategy_env env(2000);
  auto c = env.job("mirrored", "adam", 2, 16);
  c.training.epochs = 2000;  // far longer than the test waits
  c.checkpoint.every_steps = 0;
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret, {},
                  {{"TROUPE_TEST_GATE_FAILS_AFTER_S", "4"}});
  node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret);
  REQUIRE(file_shows(dir / "out/metrics.jsonl", "\"step\""));
  const int rc = chief.wait(std::chrono::seconds(60));
  CHECK_MESSAGE(rc == 1, chief.output());
  CHECK_MESSAGE(
      chief.output().find("troupe: job 'tiny' failed: chief:0: its gate stopped: it stopped "
                          "listening: injected failure") != std::string::npos,
      chief.output());
  CHECK(worker.wait(std::chrono::seconds(60)) != 0);
}

TEST_CASE(
    "a chief out of file descriptors under a flood of idle connections still takes its worker") {
  strategy_env env(240);
  auto c = env.job("mirrored", "sgd", 2, 24);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  // The chief may hold 64 descriptors (its own need about 30): the flood below
  // takes the rest, and the gate must neither spin on a listener it cannot
  // accept from nor lock the worker out.
  node_proc chief("chief:0", dir / "chief.log", kSecret,
                  {"/usr/bin/prlimit", "--nofile=64:64", TROUPE_BIN, "node", "--config", job.file,
                   "--task", "chief:0"});
  const auto port = parse_host_port(job.address.at("chief:0")).port;
  REQUIRE_MESSAGE(attack::wait_listening(port, std::chrono::seconds(30)), chief.output());
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(attack::raw_connect(port));
  node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret);
  CHECK_MESSAGE(worker.wait(std::chrono::seconds(90)) == 0, worker.output());
  CHECK_MESSAGE(chief.wait(std::chrono::seconds(30)) == 0, chief.output());
  for (int fd : idle) ::close(fd);
  CHECK(summary_in(dir / "out")["steps"].get<int64_t>() > 0);
}

// The descriptors process `pid` holds.
int descriptors_of(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// Issue 40, row 5, as a job: certificates and no secret (cluster.tls alone).
// The gate ran on a public stand-in secret, so 5,437 connections past it,
// each given a TLS link, took the chief to 1,023 of its 1,024 descriptors and
// the worker's join failed. Now the gate is keyed from the CA's certificate:
// the stranger, who has neither it nor a task's certificate, is refused at
// the gate, within its pending limit, and the worker joins.
TEST_CASE("certificates and no secret: 5,437 strangers leave the chief its descriptors; joined") {
  strategy_env env(240);
  auto c = env.job("mirrored", "sgd", 2, 24);
  c.logging.level = "info";  // the links' kind is said at info
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  tls_test::test_ca ca(dir.str(), "cluster-ca");
  auto config_of = [&](const std::string& task, const std::string& stem) {
    const auto mine = ca.issue(task, stem);
    auto j = job.json;
    j["cluster"]["tls"] = {{"ca", ca.ca_file}, {"cert", mine.cert}, {"key", mine.key}};
    const std::string file = dir / (stem + ".json");
    std::ofstream(file) << j.dump(2);
    return file;
  };
  const auto chief_file = config_of("chief:0", "chief");
  const auto worker_file = config_of("worker:0", "worker");
  // No secret at all: "" unsets TROUPE_SECRET.
  node_proc chief("chief:0", dir / "chief.log", "",
                  {"/usr/bin/prlimit", "--nofile=1024:1024", TROUPE_BIN, "node", "--config",
                   chief_file, "--task", "chief:0"});
  const auto port = parse_host_port(job.address.at("chief:0")).port;
  REQUIRE_MESSAGE(attack::wait_listening(port, std::chrono::seconds(30)), chief.output());
  // Half the connections run the gate's exchange with the public stand-in
  // (kept when admitted, as the attack held its links), half stay idle.
  gate_options stranger;
  stranger.secret = "troupe: certificates only, no secret";
  stranger.name = "worker:0";
  constexpr int kConnections = 5437;
  std::vector<int> held;
  int admitted = 0, told = 0, peak = 0;
  for (int i = 0; i < kConnections && chief.running(); ++i) {
    if (i % 2 == 0) {
      auto s = gate_handshake("127.0.0.1", port, stranger, std::chrono::seconds(2));
      if (s.fd >= 0) {
        ++admitted;
        held.push_back(s.fd);
      }
      if (s.error.find("wrong or missing cluster secret") != std::string::npos) ++told;
    } else if (int fd = attack::raw_connect(port); fd >= 0) {
      held.push_back(fd);
    }
    if (i % 64 == 0) peak = std::max(peak, descriptors_of(chief.pid));
  }
  node_proc worker("worker:0", dir / "worker.log", "",
                   {TROUPE_BIN, "node", "--config", worker_file, "--task", "worker:0"});
  while (worker.running() && chief.running()) {
    peak = std::max(peak, descriptors_of(chief.pid));
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  CHECK_MESSAGE(worker.wait(std::chrono::seconds(90)) == 0, worker.output());
  CHECK_MESSAGE(chief.wait(std::chrono::seconds(30)) == 0, chief.output());
  for (int fd : held) ::close(fd);
  MESSAGE(kConnections << " connections without a certificate: " << admitted << " past the gate, "
                       << told << " told the secret was wrong, the chief's descriptors at most "
                       << peak << " of 1024");
  CHECK(admitted == 0);
  CHECK(told > 0);
  CHECK(peak < 512);  // the gate's pending limit is a quarter of the 1,024
  const auto log = chief.output();
  CHECK(log.find("the gate is keyed from their CA's certificate") != std::string::npos);
  CHECK(log.find("refused a connection from 127.0.0.1") != std::string::npos);
  CHECK(log.find("TLS 1.3 with the certificates of cluster.tls") != std::string::npos);
  CHECK(summary_in(dir / "out")["steps"].get<int64_t>() > 0);
}

TEST_CASE("troupe launch runs every task of the cluster with troupe node") {
  strategy_env env(480);
  auto c = env.job("mirrored", "sgd", 3, 48);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  c.logging.level = "info";  // the links' kind is said at info
  cluster_job job(c, dir.str(), 2, 0);
  // No secret given: the launcher makes one up for its tasks.
  node_proc launch("launch", dir / "launch.log", "", {TROUPE_BIN, "launch", job.file});
  int rc = launch.wait(std::chrono::seconds(120));
  auto out = launch.output();
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out.find("TROUPE_SECRET is not set: the tasks share a secret made up") !=
        std::string::npos);
  CHECK(out.find("[chief:0] job tiny finished: strategy mirrored") != std::string::npos);
  CHECK(out.find("[worker:1] task worker:1 finished") != std::string::npos);
  CHECK(fs::exists(dir / "out/summary.json"));
  // Per-task identity by default: the launcher's job CA issued each task its
  // certificate over that task's own socket, and the links check them.
  CHECK(out.find("troupe launch: a job CA made for this launch issues each task its "
                 "certificate") != std::string::npos);
  for (const std::string task : {"chief:0", "worker:0", "worker:1"}) {
    CHECK_MESSAGE(
        out.find(") enrolled: the job CA issued its certificate as " + task) != std::string::npos,
        task);
    CHECK_MESSAGE(out.find(task + ": connections between tasks: TLS 1.3 with the certificates "
                                  "the job CA issued") != std::string::npos,
                  task);
  }
  CHECK(out.find("keyed from the cluster secret") == std::string::npos);
  CHECK(out.find("certificate request refused") == std::string::npos);
}

TEST_CASE("troupe launch with cluster.identity shared_secret keys the links from the secret") {
  strategy_env env(480);
  auto c = env.job("mirrored", "sgd", 3, 48);
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  c.logging.level = "info";
  cluster_job job(c, dir.str(), 1, 0);
  job.json["cluster"]["identity"] = "shared_secret";
  std::ofstream(job.file) << job.json.dump(2);
  node_proc launch("launch", dir / "launch.log", kSecret, {TROUPE_BIN, "launch", job.file});
  int rc = launch.wait(std::chrono::seconds(120));
  auto out = launch.output();
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out.find("enrolled") == std::string::npos);
  CHECK(out.find("worker:0: connections between tasks: TLS 1.3, keyed from the cluster secret") !=
        std::string::npos);
}

TEST_CASE("troupe node --task with a TROUPE_ENROL_FD that is no launcher's socket exits 2") {
  strategy_env env(480);
  auto c = env.job("mirrored", "sgd", 3, 48);
  temp_dir dir;
  cluster_job job(c, dir.str(), 1, 0);
  for (const std::string value : {"seven", "987654"}) {
    node_proc node(job.file, "worker:0", dir / "node.log", kSecret, {},
                   {{"TROUPE_ENROL_FD", value}});
    CHECK(node.wait(std::chrono::seconds(30)) == 2);
    CHECK_MESSAGE(node.output().find("troupe: TROUPE_ENROL_FD: expected the number of the socket "
                                     "troupe launch passed, got '" +
                                     value + "'") != std::string::npos,
                  node.output());
  }
}

namespace {

// The pid `troupe launch` logged for `task` ("task worker:2 (pid N) started"),
// waiting up to 60 s for the line; -1 when it never came.
// (A string search, not std::regex: GCC 12's regex trips -Wmaybe-uninitialized
// in the sanitizer build.)
pid_t launched_pid(node_proc& launch, const std::string& task) {
  const std::string head = "troupe launch: task " + task + " (pid ";
  auto until = clock_type::now() + std::chrono::seconds(60);
  do {
    auto out = launch.output();
    for (auto at = out.find(head); at != std::string::npos; at = out.find(head, at + 1)) {
      auto digits = at + head.size();
      auto end = out.find_first_not_of("0123456789", digits);
      if (end != std::string::npos && end > digits && out.compare(end, 9, ") started") == 0)
        return static_cast<pid_t>(std::stol(out.substr(digits, end - digits)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (clock_type::now() < until);
  return -1;
}

// A parameter_server job over chief, 3 workers and a ps task, run by
// `troupe launch` with `extra` options; worker:2 is SIGKILLed once pushes
// are in the metrics. Returns the launcher's exit code; its log in `out`.
int launch_ps_and_kill_worker(const temp_dir& dir, const std::vector<std::string>& extra,
                              std::string& out) {
  strategy_env env(2000);
  auto c = env.job("parameter_server", "adam", 3, 16);
  c.strategy.shards = 1;
  // 42 rounds of 3 pushes an epoch: time to restart the process (and for it
  // to join, TLS included) before the job ends.
  c.training.epochs = 80;
  c.training.eval_every_epochs = 80;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 3, 1);
  std::vector<std::string> args{TROUPE_BIN, "launch", job.file};
  args.insert(args.end(), extra.begin(), extra.end());
  node_proc launch("launch", dir / "launch.log", kSecret, args);
  pid_t worker = launched_pid(launch, "worker:2");
  REQUIRE_MESSAGE(worker > 0, launch.output());
  REQUIRE(file_shows(dir / "out/metrics.jsonl", "\"push\""));
  REQUIRE(::kill(worker, SIGKILL) == 0);
  int rc = launch.wait(std::chrono::seconds(120));
  out = launch.output();
  CHECK_MESSAGE(
      out.find("troupe launch: task worker:2 (pid " + std::to_string(worker) +
               ") killed by signal 9 (SIGKILL); the job goes on without it") != std::string::npos,
      out);
  return rc;
}

}  // namespace

TEST_CASE("troupe launch: parameter_server goes on when a worker process is SIGKILLed") {
  temp_dir dir;
  std::string out;
  int rc = launch_ps_and_kill_worker(dir, {}, out);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out.find("restarting") == std::string::npos);
  auto s = summary_in(dir / "out");
  CHECK(s["steps"] == 80 * 42 * 3);
  auto lost = metrics_of(s, "worker_lost");
  REQUIRE(lost.size() == 1);
  CHECK(lost[0]["task"] == "worker:2");
  CHECK(metrics_of(s, "worker_joined").empty());
}

TEST_CASE("troupe launch --restart-workers 1: a SIGKILLed worker process is started again") {
  temp_dir dir;
  std::string out;
  int rc = launch_ps_and_kill_worker(dir, {"--restart-workers", "1"}, out);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out.find("troupe launch: restarting task worker:2 (restart 1 of 1)") != std::string::npos);
  // The restarted process got a certificate of its own, and its links took it.
  std::size_t enrolled = 0;
  const std::string issued = ") enrolled: the job CA issued its certificate as worker:2";
  for (auto at = out.find(issued); at != std::string::npos; at = out.find(issued, at + 1))
    ++enrolled;
  CHECK_MESSAGE(enrolled == 2, out);
  auto s = summary_in(dir / "out");
  CHECK(s["steps"] == 80 * 42 * 3);
  auto lost = metrics_of(s, "worker_lost");
  REQUIRE(lost.size() == 1);
  CHECK(lost[0]["task"] == "worker:2");
  auto back = metrics_of(s, "worker_joined");
  REQUIRE(back.size() == 1);
  CHECK(back[0]["worker"] == 2);
}

TEST_CASE("troupe launch: mirrored stops every task when a worker process dies, naming it") {
  strategy_env env(2000);
  auto c = env.job("mirrored", "adam", 3, 16);
  c.training.epochs = 40;
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 2, 0);
  node_proc launch("launch", dir / "launch.log", kSecret,
                   {TROUPE_BIN, "launch", job.file, "--restart-workers", "2"});
  pid_t worker = launched_pid(launch, "worker:1");
  REQUIRE_MESSAGE(worker > 0, launch.output());
  REQUIRE(file_shows(dir / "out/metrics.jsonl", "\"type\":\"step\""));
  REQUIRE(::kill(worker, SIGKILL) == 0);
  int rc = launch.wait(std::chrono::seconds(60));
  auto out = launch.output();
  CHECK_MESSAGE(rc == 1, out);
  CHECK(out.find("--restart-workers has no effect") != std::string::npos);
  CHECK_MESSAGE(out.find("troupe launch: task worker:1 (pid " + std::to_string(worker) +
                         ") killed by signal 9 (SIGKILL); the mirrored strategy does not go on "
                         "without a task; stopping the other tasks") != std::string::npos,
                out);
  CHECK(out.find("restarting") == std::string::npos);
  CHECK_FALSE(fs::exists(dir / "out/summary.json"));
}

TEST_CASE("a replica that throws in a worker process: the chief's error carries the cause") {
  strategy_env env(480);
  auto c = env.job("mirrored", "sgd", 2, 48);
  c.training.epochs = 3;
  temp_dir dir;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);  // chief: replica 0, worker:0: replica 1
  job.json["cluster"]["hosts"] = {{"chief:0", {{"replicas", {0}}, {"devices", {"cpu:0"}}}},
                                  {"worker:0", {{"replicas", {1}}, {"devices", {"cpu:1"}}}}};
  std::ofstream(job.file) << job.json.dump(2);
  auto procs = start_all(job, dir.str(), {}, {{"worker:0", {{"TROUPE_TEST_FAIL_REPLICA", "1:4"}}}});
  int rc = procs["chief:0"]->wait(std::chrono::seconds(60));
  auto out = procs["chief:0"]->output();
  CHECK(rc == 1);
  CHECK_MESSAGE(out.find("injected failure at step 4") != std::string::npos, out);
  CHECK_MESSAGE(out.find("system_error(runtime_error)") == std::string::npos, out);
  CHECK(procs["worker:0"]->wait(std::chrono::seconds(30)) != 0);
  const auto worker_out = procs["worker:0"]->output();
  CHECK(worker_out.find("injected failure at step 4") != std::string::npos);
  // A test hook never acts unannounced.
  CHECK_MESSAGE(
      worker_out.find("test hook TROUPE_TEST_FAIL_REPLICA=1:4: replica 1 fails at step 4") !=
          std::string::npos,
      worker_out);
}
