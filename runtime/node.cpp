// troupe node: the process's run (its node actor, shards, the chief's run
// or a worker's events), its test faults and the bounded shutdown of its
// actor system.
#include "runtime/node.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "actors/failure.hpp"
#include "actors/net_system_config.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "config/secret.hpp"
#include "kernels/cpu_kernels.hpp"
#include "runtime/job_trace.hpp"
#include "runtime/local_send.hpp"
#include "runtime/node_process.hpp"
#include "runtime/preemption.hpp"
#include "runtime/process_monitoring.hpp"
#include "runtime/secure_link.hpp"
#include "runtime/stop_policy.hpp"
#include "runtime/topology.hpp"
#include "strategies/strategy.hpp"
#include "trace/trace.hpp"

namespace troupe {

namespace {

using namespace node_detail;
namespace fs = std::filesystem;

// The actor system of a node and its config (which the system refers to):
// they are ended together, possibly on another thread (end_node_system).
struct node_system {
  net_system_config cfg;
  caf::actor_system sys;
  explicit node_system(caf::timespan heartbeat)
      : cfg(heartbeat, std::max<caf::timespan>(3 * heartbeat, std::chrono::seconds(1))), sys(cfg) {}
};

std::atomic<bool> system_left_running{false};

// Ends the system within `limit`. By now every troupe actor is done and
// every result is on disk; what can remain is CAF 0.17's BASP broker keeping
// a stopped actor alive (messages stranded in a stopped broker's mailbox),
// and ~actor_system then waits for that actor's thread for ever. Past the
// limit the system is left to the end of the process instead.
void end_node_system(std::unique_ptr<node_system> ns, const std::string& task,
                     std::chrono::seconds limit) {
  // CAF's logger lives until every thread that used the system lets go of
  // it, and ~actor_system waits for that: this thread lets go here.
  caf::logger::set_current_actor_system(nullptr);
  auto done = std::make_shared<std::promise<void>>();
  auto ended = done->get_future();
  std::thread([ns = std::move(ns), done]() mutable {
    ns.reset();
    done->set_value();
  }).detach();
  if (ended.wait_for(limit) == std::future_status::ready) return;
  system_left_running = true;
  spdlog::warn(
      "{}: the actor system did not stop within {} s (CAF's network layer holds a "
      "stopped actor); the process ends without waiting for it",
      task, limit.count());
}

// Test interface of troupe node, whose tests run it as a process: the
// faults of `o` and those the environment names (docs/testing.md, "Test
// hooks"; each is logged at warning when set, so that a stray one in a
// user's environment shows):
//   TROUPE_TEST_FAIL_REPLICA="K:S": replica K, when this process hosts it,
//     throws in its compute at step S;
//   TROUPE_TEST_HOLD_SHARD_AT_EXIT (any value): a shard handle outlives the
//     job (fault_injection::hold_shard_at_exit).
std::shared_ptr<const fault_injection> faults_from_environment(
    const std::shared_ptr<const fault_injection>& given) {
  const char* fail_replica = std::getenv("TROUPE_TEST_FAIL_REPLICA");
  const bool hold_shard = std::getenv("TROUPE_TEST_HOLD_SHARD_AT_EXIT") != nullptr;
  if (!fail_replica && !hold_shard) return given;
  auto faults = faults_or_none(given);
  long long k = -1, step = -1;
  if (fail_replica && std::sscanf(fail_replica, "%lld:%lld", &k, &step) == 2) {
    faults.fail_replica = {k, step};
    spdlog::warn("test hook TROUPE_TEST_FAIL_REPLICA={}: replica {} fails at step {}", fail_replica,
                 k, step);
  } else if (fail_replica) {
    spdlog::warn("test hook TROUPE_TEST_FAIL_REPLICA={}: not \"K:S\", ignored", fail_replica);
  }
  if (hold_shard)
    spdlog::warn("test hook TROUPE_TEST_HOLD_SHARD_AT_EXIT: a shard handle outlives the job");
  faults.hold_shard_at_exit = faults.hold_shard_at_exit || hold_shard;
  return inject_faults(faults);
}

// `held_past_shutdown` gets a shard handle under the hold_shard_at_exit
// fault: the caller releases it only after the bounded shutdown.
namespace {

// The cluster secret; with certificates (cluster.tls) it may be absent: they
// alone authenticate then.
std::string node_secret(const cluster_spec& spec, const std::string& me) {
  if (spec.tls.ca.empty()) return load_cluster_secret(spec);
  try {
    return load_cluster_secret(spec);
  } catch (const secret_error&) {
    spdlog::info("{}: no cluster secret; the certificates of cluster.tls authenticate tasks", me);
    return kCertificatesOnlySecret;
  }
}

// TLS between tasks, with the cap on a frame from the model: its state with
// three optimizer slots (a checkpoint's), and room for the build order.
link_security node_link_security(const cluster_spec& spec, const std::string& secret,
                                 const job_plan& plan, const std::string& me) {
  constexpr uint64_t mib = uint64_t{1} << 20;
  const uint64_t state = model_state_bytes(plan);
  const uint64_t cap = state == 0 ? 256 * mib : std::max(64 * mib, 4 * state + 16 * mib);
  link_security s;
  try {
    s = link_security_for(spec, secret, cap);
    check_link_security(s);
  } catch (const link_error& e) {
    throw job_error(me + ": " + e.what());
  }
  const char* kind = s.kind == link_security::trust::psk ? "TLS 1.3, keyed from the cluster secret"
                     : s.kind == link_security::trust::certificates
                         ? "TLS 1.3 with the certificates of cluster.tls"
                         : "PLAINTEXT (cluster.insecure)";
  if (s.kind == link_security::trust::insecure)
    spdlog::warn(
        "{}: cluster.insecure is true: traffic between tasks is not encrypted, and "
        "anyone on the network path can read and change it",
        me);
  spdlog::info("{}: connections between tasks: {}; frames up to {} MiB", me, kind,
               s.max_frame_bytes / mib);
  return s;
}

}  // namespace

nlohmann::json run_node_on(caf::actor_system& sys, const job_config& c, const task_id& task,
                           const job_options& o,
                           std::vector<variable_shard_actor>& held_past_shutdown) {
  const auto& spec = *c.cluster;
  const bool chief = task.job == "chief";
  auto shared = std::make_shared<node_shared>();
  shared->task = task.str();
  shared->chief = chief;
  shared->secret = node_secret(spec, task.str());
  shared->handshake_key = derive_key(shared->secret, key_purpose::node_handshake);
  auto placement = resolve_placement(c);
  auto mine = placement_of(placement, task);
  auto plan = make_plan(c, o, chief);
  // Until the job trains, a signal stops this process at once: nothing to
  // keep (runtime/stop_policy.hpp).
  stop_policy::enter(stop_policy::phase::joining);
  shared->link = node_link_security(spec, shared->secret, *plan, task.str());
  std::optional<trace::session> tracing;  // this task's own trace file
  start_trace(tracing, c, o);
  // /metrics on every task; TensorBoard where the coordinator runs.
  process_monitoring monitor(c, plan->output_dir, task.str(), sys);
  if (chief) plan->metrics_sink = monitor.job_sinks(*plan);
  if (chief)
    spdlog::info("job '{}': strategy {}, {} steps ({} per epoch), {} tasks, output {}", c.name,
                 c.strategy.kind, plan->total_steps, plan->steps_per_epoch, placement.size(),
                 plan->output_dir);

  // Tasks with replicas, in all_tasks order: the ring across processes.
  std::vector<std::string> ring_tasks;
  for (const auto& p : placement)
    if (!p.replicas.empty()) ring_tasks.push_back(p.task.str());
  const bool cross_ring = plan->strat->reduces_across_processes() && ring_tasks.size() > 1;
  if (!cross_ring) ring_tasks.clear();
  ring_node_actor ring;
  if (cross_ring && !mine.replicas.empty()) ring = spawn_ring_node(sys);

  auto node = spawn_node_actor(sys, shared, ring, &c);
  node_process np{c,
                  task,
                  o,
                  plan,
                  placement,
                  mine,
                  shared,
                  sys,
                  node,
                  ring,
                  std::chrono::duration_cast<caf::timespan>(
                      std::chrono::duration<double>(spec.join_timeout_seconds)),
                  {},
                  {}};
  const auto address = task_address(spec, task);
  const auto hp = parse_host_port(address);
  // Peers reach the node actor only through the gate (runtime/gate.hpp).
  std::unique_ptr<gate> door;
  try {
    auto gopts = np.gate_opts();
    // A gate that stops leaves a port no one answers: this process ends its
    // run with the error, as when it loses a peer.
    // Fault injection for the tests (tests/test_nodes.cpp): the gate's
    // thread fails this many seconds after it starts.
    if (const char* after = std::getenv("TROUPE_TEST_GATE_FAILS_AFTER_S")) {
      spdlog::warn("test hook TROUPE_TEST_GATE_FAILS_AFTER_S={}: this gate fails after {} s", after,
                   std::atof(after));
      const auto at = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(std::atof(after)));
      gopts.on_turn = [at] {
        if (std::chrono::steady_clock::now() >= at)
          throw std::runtime_error("injected failure (TROUPE_TEST_GATE_FAILS_AFTER_S)");
      };
    }
    gopts.on_failure = [shared, name = task.str()](const std::string& why) {
      spdlog::error("{}: its gate stopped ({}); ending this process's run", name, why);
      caf::actor watch;
      {
        std::lock_guard<std::mutex> guard(shared->gate_watch_mutex);
        watch = shared->gate_watch;
      }
      if (watch) {  // a chief's running job: its coordinator sees the watch exit
        caf::anon_send(watch, caf::exit_msg{caf::actor_addr{},
                                            caf::make_error(caf::sec::runtime_error,
                                                            "it stopped listening: " + why)});
        return;
      }
      shared->events.push(
          {node_event::lost, name, {}, {}, {}, "its gate stopped listening: " + why, {}});
    };
    door = open_gate(sys, node, hp.host, hp.port, std::move(gopts));
  } catch (const gate_error& e) {
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    if (ring) caf::anon_send_exit(ring, caf::exit_reason::user_shutdown);
    throw job_error(task.str() + ": " + e.what());
  }
  spdlog::info("{}: listening on {}", task.str(), address);

  job_actors here;  // this task's workers, shards and (chief) hub
  auto& my_shards = here.shards;
  auto& workers = here.workers;
  shard_set shards;
  std::string error;
  nlohmann::json summary = nlohmann::json::object();
  const auto deadline = clock_type::now() + np.join_timeout;
  auto& events = shared->events;
  try {
    if (!mine.shards.empty()) {
      shards = plan_shards(*plan);
      spawn_shards(sys, *plan, mine.shards, shards);
      my_shards = shards.actors;
      if (faults_or_none(o.faults).hold_shard_at_exit && !my_shards.empty())
        held_past_shutdown.push_back(my_shards.front());
    }
    if (!chief) {
      node_parts hello_parts;
      hello_parts.task = task.str();
      hello_parts.shard_indices = mine.shards;
      hello_parts.shards = my_shards;
      // Shards first, so that their handles, which reach this task through
      // the chief, route straight to the ps task; then the chief.
      if (!mine.replicas.empty())
        for (const auto& p : placement)
          if (!p.shards.empty() && p.task.job != "chief") np.connect(p.task, {}, deadline);
      auto chief_node = np.connect({"chief", 0}, hello_parts, deadline);
      (void)chief_node;
      // A task without replicas (ps) is built once it joined: its shards
      // serve the job, so a signal now stops the job with a checkpoint. A
      // task with replicas trains once they are built (below).
      if (mine.replicas.empty()) stop_policy::enter(stop_policy::phase::training);
      // Asked to leave: the chief stops the whole job with a checkpoint.
      preemption::watch preempt([&sys, node](int signal) {
        send_from_here(sys, node, preempt_atom::value, preemption::signal_name(signal));
      });
      for (bool done = false; !done;) {
        auto ev = events.pop_until(clock_type::time_point::max());
        if (!ev) continue;
        switch (ev->kind) {
          case node_event::build:
            try {
              workers = np.build_workers(ev->order);
              send_from_here(sys, node, built_atom::value, np.parts_of(workers));
              stop_policy::enter(stop_policy::phase::training);
              spdlog::info("{}: built {}s {}", task.str(), plan->strat->replica_unit(),
                           fmt::join(workers.indices, ", "));
            } catch (const std::exception& e) {
              send_from_here(sys, node, built_atom::value, std::string(e.what()));
              throw;
            }
            break;
          case node_event::stop:
            stop_policy::enter(ev->preempted.empty() ? stop_policy::phase::writing
                                                     : stop_policy::phase::leaving);
            if (!ev->reason.empty()) error = "the chief ended the job: " + ev->reason;
            if (!ev->preempted.empty()) summary["preempted"] = ev->preempted;
            done = true;
            break;
          case node_event::lost:
            error = "lost " + ev->task + " (" + ev->reason + ")";
            done = true;
            break;
          case node_event::joined:
            break;
        }
      }
    } else {
      summary = run_chief(np, shards, workers, deadline, here.hub);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (chief) {
    // Every task that joined, restarted ones included, learns the end.
    caf::scoped_actor self{sys};
    self->request(node, std::chrono::seconds(5), stop_atom::value, error,
                  summary.value("preempted", std::string()))
        .receive([](int32_t) {}, [](caf::error&) {});
  }
  here.stop({caf::actor_cast<caf::actor>(ring), caf::actor_cast<caf::actor>(node)});
  door.reset();
  shards = {};
  np.joined.clear();
  here.join(sys);
  const auto traffic = link_totals();
  spdlog::info("{}: {:.1f} MB sent to and {:.1f} MB received from other tasks", task.str(),
               static_cast<double>(traffic.bytes_out) / 1e6,
               static_cast<double>(traffic.bytes_in) / 1e6);
  if (!error.empty())
    throw job_error(error.rfind(task.str(), 0) == 0 ? error : task.str() + ": " + error);
  finish_trace(tracing, summary);
  if (chief)
    write_job_file((fs::path(plan->output_dir) / "summary.json").string(), summary.dump(2) + '\n');
  return summary;
}

}  // namespace

nlohmann::json run_node(const job_config& c, const task_id& task, const job_options& o) {
  if (!c.cluster)
    throw config_error("cluster", "troupe node needs a \"cluster\" section in the job config");
  if (!has_task(*c.cluster, task))
    throw config_error("cluster.tasks", "this cluster has no task " + task.str());
  kernels::init_cpu_kernels();
  // Which kernels run, measured here, so a slow machine's log says why.
  spdlog::info("kernels: {}", kernels::describe_cpu_kernels(true));
  auto ns = std::make_unique<node_system>(std::chrono::duration_cast<caf::timespan>(
      std::chrono::duration<double>(c.cluster->heartbeat_seconds)));
  job_options options = o;
  options.faults = faults_from_environment(o.faults);
  std::vector<variable_shard_actor> held_past_shutdown;
  nlohmann::json summary;
  std::exception_ptr failure;
  try {
    summary = run_node_on(ns->sys, c, task, options, held_past_shutdown);
  } catch (...) {
    failure = std::current_exception();
  }
  end_node_system(std::move(ns), task.str(), std::chrono::seconds(5));
  // Past the bounded wait: the system may end now, on its own thread.
  held_past_shutdown.clear();
  if (failure) std::rethrow_exception(failure);
  return summary;
}

bool node_system_left_running() {
  return system_left_running;
}

}  // namespace troupe
