// troupe node: the process's run (its node actor, shards, the chief's run
// or a worker's events), its test faults and the bounded shutdown of its
// actor system.
#include "runtime/node.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

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
#include "net/basp_guard.hpp"
#include "net/chief_enrol.hpp"
#include "net/secure_link.hpp"
#include "runtime/job_trace.hpp"
#include "runtime/local_send.hpp"
#include "runtime/node_process.hpp"
#include "runtime/preemption.hpp"
#include "runtime/process_monitoring.hpp"
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

namespace {

// The cluster secret; with certificates (cluster.tls) it may be absent: they
// alone authenticate then, and the gate is keyed from their CA's certificate
// (net/secure_link.hpp, certificates_only_secret), so that a stranger
// without it stops at the gate.
std::string node_secret(const cluster_spec& spec, const std::string& me) {
  if (spec.tls.ca.empty()) return load_cluster_secret(spec);
  try {
    return load_cluster_secret(spec);
  } catch (const secret_error&) {
  }
  spdlog::info(
      "{}: no cluster secret; the certificates of cluster.tls authenticate tasks, and the gate is "
      "keyed from their CA's certificate",
      me);
  link_security files;
  files.kind = link_security::trust::certificates;
  files.ca_file = spec.tls.ca;
  try {
    return certificates_only_secret(files);
  } catch (const link_error& e) {
    throw job_error(me + ": " + e.what());
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
                     : s.identity ? "TLS 1.3 with the certificates the job CA issued, one per task"
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

// Whether this task is of a written-out cluster.tasks started by hand under
// cluster.identity "job_ca" (no certificate from the rendezvous or troupe
// launch, no cluster.tls, links encrypted): then the chief holds the job CA
// and the other tasks enrol with it (net/chief_enrol.hpp).
bool enrols_with_chief(const cluster_spec& spec) {
  return spec.identity == cluster_spec::identity_mode::job_ca && spec.tls.ca.empty() &&
         !spec.insecure && !issued_identity::held();
}

}  // namespace

// One run of troupe node's task, one phase at a time:
//
//   preparing -> listening -> joining -> running -> ending
//
// preparing: the secret, the plan, TLS, trace and monitoring, the ring node
// and the node actor; listening: the gate is open; joining: this task's
// shards, then (a worker) its connections to the ps tasks and the chief;
// running: the chief runs the job (run_chief), a worker handles the node
// actor's events (one handler each) until the job stops or a peer is lost;
// ending: every actor stopped and joined, the summary or the error.
class node_run {
 public:
  node_run(caf::actor_system& sys, const job_config& c, const task_id& task, const job_options& o,
           std::vector<variable_shard_actor>& held_past_shutdown)
      : sys_(sys),
        c_(c),
        task_(task),
        o_(o),
        held_past_shutdown_(held_past_shutdown),
        chief_(task.job == "chief") {}

  nlohmann::json run() {
    prepare();
    open_door();
    try {
      phase_ = phase::joining;
      host_shards();
      if (chief_)
        summary_ = run_chief(*np_, shards_, here_.workers, deadline_, here_.hub);
      else
        run_worker();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    return end();
  }

 private:
  enum class phase { preparing, listening, joining, running, ending };

  std::string name() const { return task_.str(); }

  void prepare() {
    const auto& spec = *c_.cluster;
    shared_ = std::make_shared<node_shared>();
    shared_->task = name();
    shared_->chief = chief_;
    shared_->secret = node_secret(spec, name());
    shared_->handshake_key = derive_key(shared_->secret, key_purpose::node_handshake);
    placement_ = resolve_placement(c_);
    mine_ = placement_of(placement_, task_);
    plan_ = make_plan(c_, o_, chief_);
    // Until the job trains, a signal stops this process at once: nothing to
    // keep (runtime/stop_policy.hpp).
    stop_policy::enter(stop_policy::phase::joining);
    take_identity(spec);
    shared_->link = node_link_security(spec, shared_->secret, *plan_, name());
    start_trace(tracing_, c_, o_);
    // /metrics on every task; TensorBoard where the coordinator runs.
    monitor_ = std::make_unique<process_monitoring>(c_, plan_->output_dir, name(), sys_);
    if (chief_) {
      plan_->metrics_sink = monitor_->job_sinks(*plan_);
      spdlog::info("job '{}': strategy {}, {} steps ({} per epoch), {} tasks, output {}", c_.name,
                   c_.strategy.kind, plan_->total_steps, plan_->steps_per_epoch, placement_.size(),
                   plan_->output_dir);
    }
    spawn_ring_and_node();
  }

  // A task started by hand under the job CA: the chief makes the CA and its
  // own certificate, and opens its enrolment desk; another task enrols with
  // it (retried until its join deadline: the chief may still be starting)
  // and holds its name there until its link to the chief is up.
  void take_identity(const cluster_spec& spec) {
    if (!enrols_with_chief(spec)) return;
    if (chief_) {
      desk_ = std::make_unique<chief_enrol::desk>(name(), [&sys = sys_](const std::string& t) {
        return task_has_live_link(sys.node(), t);
      });
      issued_identity::keep(desk_->issue_self());
      spdlog::info("{}: made the job CA in memory; tasks started by hand enrol at {}", name(),
                   chief_enrol::door_of(name()));
      return;
    }
    const auto chief = parse_host_port(task_address(spec, {"chief", 0}));
    const auto by =
        clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                std::chrono::duration<double>(spec.join_timeout_seconds));
    spdlog::info("{}: enrolling with chief:0 at {}:{} for its certificate from the job CA", name(),
                 chief.host, chief.port);
    try {
      auto e = chief_enrol::enrol(shared_->secret, name(), "chief:0", chief.host, chief.port, by);
      enrol_fd_ = e.held_fd;
      issued_identity::keep(std::move(e.identity));
    } catch (const job_ca_error& e) {
      throw job_error(e.what());
    }
    spdlog::info("{}: enrolled with chief:0: the job CA issued its certificate", name());
  }

  // The enrolment connection holds this task's name at the chief until its
  // link there is up (which holds it from then on).
  void release_enrolment() {
    if (enrol_fd_ >= 0) ::close(enrol_fd_);
    enrol_fd_ = -1;
  }

  // The ring across processes joins the tasks with replicas, where the
  // strategy reduces across processes and there is more than one.
  void spawn_ring_and_node() {
    std::size_t ring_tasks = 0;
    for (const auto& p : placement_)
      if (!p.replicas.empty()) ++ring_tasks;
    const bool cross_ring = plan_->strat->reduces_across_processes() && ring_tasks > 1;
    if (cross_ring && !mine_.replicas.empty()) ring_ = spawn_ring_node(sys_);
    node_ = spawn_node_actor(sys_, shared_, ring_, &c_);
    np_ = std::make_unique<node_process>(
        node_process{c_,
                     task_,
                     o_,
                     plan_,
                     placement_,
                     mine_,
                     shared_,
                     sys_,
                     node_,
                     ring_,
                     std::chrono::duration_cast<caf::timespan>(
                         std::chrono::duration<double>(c_.cluster->join_timeout_seconds)),
                     {},
                     {}});
  }

  // Peers reach the node actor only through the gate (net/gate.hpp).
  void open_door() {
    const auto address = task_address(*c_.cluster, task_);
    const auto hp = parse_host_port(address);
    try {
      door_ = open_gate(sys_, node_, hp.host, hp.port, door_options());
    } catch (const gate_error& e) {
      caf::anon_send_exit(node_, caf::exit_reason::user_shutdown);
      if (ring_) caf::anon_send_exit(ring_, caf::exit_reason::user_shutdown);
      throw job_error(name() + ": " + e.what());
    }
    phase_ = phase::listening;
    spdlog::info("{}: listening on {}", name(), address);
    deadline_ = clock_type::now() + np_->join_timeout;
  }

  gate_options door_options() const {
    auto gopts = np_->gate_opts();
    if (desk_) {
      gopts.side_door = chief_enrol::door_of(name());
      gopts.on_side_door = [desk = desk_.get()](int fd, const std::string& task,
                                                const std::string& peer) {
        desk->add(fd, task, peer);
      };
    }
    // A gate that stops leaves a port no one answers: this process ends its
    // run with the error, as when it loses a peer.
    gopts.on_failure = [shared = shared_, name = name()](const std::string& why) {
      on_gate_failure(*shared, name, why);
    };
    // The gate_fails_after_seconds fault (tests/test_nodes.cpp): the gate's
    // thread fails that long after it starts.
    const double fails_after = faults_or_none(o_.faults).gate_fails_after_seconds;
    if (fails_after >= 0) {
      const auto at = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(fails_after));
      gopts.on_turn = [at] {
        if (std::chrono::steady_clock::now() >= at)
          throw std::runtime_error("injected failure (gate_fails_after_seconds)");
      };
    }
    return gopts;
  }

  // On the gate's thread: a chief's running job ends through its
  // coordinator's watch; otherwise the main thread gets a `lost` event.
  static void on_gate_failure(node_shared& shared, const std::string& name,
                              const std::string& why) {
    spdlog::error("{}: its gate stopped ({}); ending this process's run", name, why);
    caf::actor watch;
    {
      std::lock_guard<std::mutex> guard(shared.gate_watch_mutex);
      watch = shared.gate_watch;
    }
    if (watch) {
      caf::anon_send(
          watch, caf::exit_msg{caf::actor_addr{}, caf::make_error(caf::sec::runtime_error,
                                                                  "it stopped listening: " + why)});
      return;
    }
    shared.events.push(
        {node_event::lost, name, {}, {}, {}, "its gate stopped listening: " + why, {}});
  }

  void host_shards() {
    if (mine_.shards.empty()) return;
    shards_ = plan_shards(*plan_);
    spawn_shards(sys_, *plan_, mine_.shards, shards_);
    here_.shards = shards_.actors;
    if (faults_or_none(o_.faults).hold_shard_at_exit && !here_.shards.empty())
      held_past_shutdown_.push_back(here_.shards.front());
  }

  void run_worker() {
    join_as_worker();
    // Asked to leave: the chief stops the whole job with a checkpoint.
    preemption::watch preempt([&sys = sys_, node = node_](int signal) {
      send_from_here(sys, node, preempt_atom::value, preemption::signal_name(signal));
    });
    phase_ = phase::running;
    while (phase_ == phase::running) {
      auto ev = shared_->events.pop_until(clock_type::time_point::max());
      if (!ev) continue;
      switch (ev->kind) {
        case node_event::build:
          on_build(*ev);
          break;
        case node_event::stop:
          on_stop(*ev);
          break;
        case node_event::lost:
          on_lost(*ev);
          break;
        case node_event::joined:
          break;
      }
    }
  }

  void join_as_worker() {
    node_parts hello;
    hello.task = name();
    hello.shard_indices = mine_.shards;
    hello.shards = here_.shards;
    // Shards first, so that their handles, which reach this task through
    // the chief, route straight to the ps task; then the chief.
    if (!mine_.replicas.empty())
      for (const auto& p : placement_)
        if (!p.shards.empty() && p.task.job != "chief") np_->connect(p.task, {}, deadline_);
    np_->connect({"chief", 0}, hello, deadline_);
    release_enrolment();
    // A task without replicas (ps) is built once it joined: its shards
    // serve the job, so a signal now stops the job with a checkpoint. A
    // task with replicas trains once they are built (on_build).
    if (mine_.replicas.empty()) stop_policy::enter(stop_policy::phase::training);
  }

  // The chief's order to build this task's replicas (or workers).
  void on_build(const node_event& ev) {
    try {
      here_.workers = np_->build_workers(ev.order);
      send_from_here(sys_, node_, built_atom::value, np_->parts_of(here_.workers));
      stop_policy::enter(stop_policy::phase::training);
      spdlog::info("{}: built {}s {}", name(), plan_->strat->replica_unit(),
                   fmt::join(here_.workers.indices, ", "));
    } catch (const std::exception& e) {
      send_from_here(sys_, node_, built_atom::value, std::string(e.what()));
      throw;
    }
  }

  // The chief ended the job: with an error, preempted, or done.
  void on_stop(const node_event& ev) {
    stop_policy::enter(ev.preempted.empty() ? stop_policy::phase::writing
                                            : stop_policy::phase::leaving);
    if (!ev.reason.empty()) error_ = "the chief ended the job: " + ev.reason;
    if (!ev.preempted.empty()) summary_["preempted"] = ev.preempted;
    phase_ = phase::ending;
  }

  void on_lost(const node_event& ev) {
    error_ = "lost " + ev.task + " (" + ev.reason + ")";
    phase_ = phase::ending;
  }

  nlohmann::json end() {
    phase_ = phase::ending;
    if (chief_) tell_tasks_the_end();
    here_.stop({caf::actor_cast<caf::actor>(ring_), caf::actor_cast<caf::actor>(node_)});
    release_enrolment();
    door_.reset();
    shards_ = {};
    np_->joined.clear();
    here_.join(sys_);
    const auto traffic = link_totals();
    spdlog::info("{}: {:.1f} MB sent to and {:.1f} MB received from other tasks", name(),
                 static_cast<double>(traffic.bytes_out) / 1e6,
                 static_cast<double>(traffic.bytes_in) / 1e6);
    if (!error_.empty())
      throw job_error(error_.rfind(name(), 0) == 0 ? error_ : name() + ": " + error_);
    finish_trace(tracing_, summary_);
    if (chief_)
      write_job_file((fs::path(plan_->output_dir) / "summary.json").string(),
                     summary_.dump(2) + '\n');
    return summary_;
  }

  // Every task that joined, restarted ones included, learns the end.
  void tell_tasks_the_end() {
    caf::scoped_actor self{sys_};
    self->request(node_, std::chrono::seconds(5), stop_atom::value, error_,
                  summary_.value("preempted", std::string()))
        .receive([](int32_t) {}, [](caf::error&) {});
  }

  caf::actor_system& sys_;
  const job_config& c_;
  const task_id task_;
  const job_options& o_;
  // Gets a shard handle under the hold_shard_at_exit fault: the caller
  // releases it only after the bounded shutdown.
  std::vector<variable_shard_actor>& held_past_shutdown_;
  const bool chief_;
  phase phase_ = phase::preparing;
  // In the order the run makes them, so that they end in reverse.
  std::shared_ptr<node_shared> shared_;
  std::vector<task_placement> placement_;
  task_placement mine_;
  std::shared_ptr<job_plan> plan_;
  std::optional<trace::session> tracing_;  // this task's own trace file
  std::unique_ptr<process_monitoring> monitor_;
  ring_node_actor ring_;
  node_actor node_;
  std::unique_ptr<node_process> np_;
  std::unique_ptr<chief_enrol::desk> desk_;  // chief: the job CA (before door_: it outlives it)
  int enrol_fd_ = -1;                        // another task: its enrolment connection
  std::unique_ptr<gate> door_;
  clock_type::time_point deadline_{};  // of joining
  job_actors here_;                    // this task's workers, shards and (chief) hub
  shard_set shards_;
  std::string error_;
  nlohmann::json summary_ = nlohmann::json::object();
};

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
  std::vector<variable_shard_actor> held_past_shutdown;
  nlohmann::json summary;
  std::exception_ptr failure;
  try {
    summary = node_run(ns->sys, c, task, o, held_past_shutdown).run();
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
