#pragma once
// What the files of troupe node (runtime/node*.cpp) share: the events its
// node actor hands to the process's main thread, the node actor, the
// process (connecting, the ring, building) and the chief's run.
#include <caf/all.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/worker_parts.hpp"
#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "messages/node_messages.hpp"
#include "net/gate.hpp"
#include "runtime/job.hpp"
#include "runtime/topology.hpp"

namespace troupe {
class job_hub;  // strategies/strategy.hpp
}  // namespace troupe

namespace troupe::node_detail {

using clock_type = std::chrono::steady_clock;

// The limit on every request between actors of a multi-process job. A lost
// or hung peer is detected much sooner (its down message, heartbeats); this
// only bounds what CAF would otherwise leave pending for ever.
inline const caf::duration kRequestTimeout{std::chrono::seconds(600)};
// How long a running job may make no update before the chief says so, at
// warning, naming its tasks (runtime/stall_watch.hpp), and again after each
// further period: far above a step of any job troupe runs, far below
// kRequestTimeout.
inline constexpr std::chrono::seconds kStallWarning{30};

// What the node actor hands to the process's main thread, which does all
// the blocking work (connecting, building, running the coordinator).
struct node_event {
  enum kind_t { joined, build, stop, lost } kind = stop;
  std::string task;  // joined, lost: the peer
  node_parts parts;  // joined
  caf::actor node;   // joined: the peer's node actor
  node_build order;  // build
  std::string reason;
  std::string preempted;  // stop: the job ended preempted by this ("" = it did not)
};

class event_queue {
 public:
  void push(node_event e) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_all();
  }
  std::optional<node_event> pop_until(clock_type::time_point deadline) {
    std::unique_lock<std::mutex> g(mu_);
    if (!cv_.wait_until(g, deadline, [&] { return !q_.empty(); })) return std::nullopt;
    auto e = std::move(q_.front());
    q_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<node_event> q_;
};

struct node_shared {
  std::string task;
  std::string secret;
  std::string handshake_key;  // derive_key(secret, key_purpose::node_handshake)
  link_security link;         // what runs on every connection (net/secure_link.hpp)
  bool chief = false;
  event_queue events;
  // On the chief while its job runs (run_chief sets it): an actor its
  // coordinator watches as "its gate". A gate that fails mid-job ends it, so
  // the job stops with the error instead of training on behind a closed port.
  std::mutex gate_watch_mutex;
  caf::actor gate_watch;
};

// The node actor of this process (the handshake, build orders, stops);
// `config` outlives it.
node_actor spawn_node_actor(caf::actor_system& sys, std::shared_ptr<node_shared> shared,
                            ring_node_actor ring, const job_config* config);

// The node handshake (config/secret.hpp) of this process, task `me` with
// node actor `node`, with `peer`, the node actor of task `peer_task`, keyed
// by `key` (derive_key(secret, key_purpose::node_handshake)): both prove the
// secret, then `node` takes `peer` for `peer_task` (with `monitor`, losing
// it ends this task). Empty, or why it failed.
std::string node_handshake(caf::actor_system& sys, const node_actor& node, const node_actor& peer,
                           const std::string& me, const std::string& peer_task,
                           const std::string& key, bool monitor);

struct node_process {
  const job_config& c;
  task_id me;
  job_options options;
  std::shared_ptr<job_plan> plan;
  std::vector<task_placement> placement;
  task_placement mine;
  std::shared_ptr<node_shared> shared;
  caf::actor_system& sys;
  node_actor node;
  ring_node_actor ring;
  caf::timespan join_timeout;
  // Peers this process connected to (and authenticated), by task.
  std::map<std::string, node_actor> connected;
  // Chief: every task that joined, by name.
  std::map<std::string, node_event> joined;

  std::string name() const { return me.str(); }
  gate_options gate_opts() const {
    gate_options g;
    g.secret = shared->secret;
    g.name = name();
    g.link = shared->link;
    // Only the cluster's tasks get in.
    for (const auto& t : all_tasks(spec())) g.allowed_peers.insert(t.str());
    return g;
  }
  const cluster_spec& spec() const { return *c.cluster; }

  // Connects to `task`'s node actor (retrying until the join deadline: the
  // peer may still be starting) and runs the mutual handshake.
  node_actor connect(const task_id& task, const node_parts& parts, clock_type::time_point deadline);

  // mirrored across processes: joins the ring of tasks `ring_tasks`,
  // reaching a lower rank's ring node through its node actor.
  void join_process_ring(const std::vector<std::string>& ring_tasks);
  // Then, where the strategy uses them: this process's direct links to its
  // ring neighbours (runtime/process_links.hpp).
  std::shared_ptr<process_group> join_links(const std::vector<std::string>& ring_tasks);

  // Builds this task's replicas (with their pipelines, devices, reducers),
  // or a strategy's own workers.
  worker_parts build_workers(const node_build& order);

  node_parts parts_of(const worker_parts& w) const;
};

// The chief: waits for every task, spawns the coordinator (and a strategy's
// hub), orders the builds, and runs the coordinator over every process's
// replicas and shards, or the strategy's workers.
nlohmann::json run_chief(node_process& np, shard_set& shards, worker_parts& workers,
                         clock_type::time_point deadline, std::shared_ptr<job_hub>& hub);

}  // namespace troupe::node_detail
