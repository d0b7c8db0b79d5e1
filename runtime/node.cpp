#include "runtime/node.hpp"
#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <caf/io/all.hpp>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "actors/net_system_config.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "config/secret.hpp"
#include "kernels/cpu_kernels.hpp"
#include "messages/node_messages.hpp"
#include "runtime/coordinator.hpp"
#include "runtime/gate.hpp"
#include "runtime/job.hpp"
#include "runtime/topology.hpp"
#include "strategies/strategy.hpp"
#include "trace/trace.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;
namespace fs = std::filesystem;

// The limit on every request between actors of a multi-process job. A lost
// or hung peer is detected much sooner (its down message, heartbeats); this
// only bounds what CAF would otherwise leave pending for ever.
const caf::duration kRequestTimeout{std::chrono::seconds(600)};

// What the node actor hands to the process's main thread, which does all
// the blocking work (connecting, building, running the coordinator).
struct node_event {
  enum kind_t { joined, build, stop, lost } kind = stop;
  std::string task;  // joined, lost: the peer
  node_parts parts;  // joined
  caf::actor node;   // joined: the peer's node actor
  node_build order;  // build
  std::string reason;
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
  bool chief = false;
  event_queue events;
};

struct node_state {
  std::shared_ptr<node_shared> shared;
  ring_node_actor ring;
  // Per peer process: the task it claims and the challenge it was given.
  std::map<caf::node_id, std::pair<std::string, std::string>> challenges;
  std::set<caf::node_id> trusted;
  std::map<caf::node_id, std::string> names;     // trusted peer -> its task
  std::map<caf::actor_addr, std::string> peers;  // monitored node actors -> task
  std::optional<caf::typed_response_promise<node_parts>> building;
  // Chief, once the job runs: where rejoining workers go.
  bool started = false;
  coordinator_actor coordinator;
  node_build order;
  const job_config* config = nullptr;
  static inline const char* name = "node";
};

using node_ptr = node_actor::stateful_pointer<node_state>;

// True for a message from this process or from a peer that completed the
// handshake.
bool trusted_sender(node_ptr self) {
  const auto& s = self->current_sender();
  if (!s) return false;
  if (s->node() == self->home_system().node()) return true;
  return self->state.trusted.count(s->node()) > 0;
}

caf::error refuse(node_ptr self, const char* what) {
  const auto& s = self->current_sender();
  std::string from = s ? to_string(s->node()) : std::string("an anonymous sender");
  spdlog::warn("{}: refused '{}' from {}: it has not proved it knows the cluster secret",
               self->state.shared->task, what, from);
  return caf::make_error(caf::sec::runtime_error,
                         self->state.shared->task + ": '" + what + "' refused: not authenticated");
}

// A failed build, delivered to the chief as the reply's error.
caf::error build_error(const std::string& task, const std::string& why) {
  return caf::make_error(caf::sec::runtime_error, task + ": " + why);
}

void watch_peer(node_ptr self, const caf::actor& peer, const std::string& task) {
  if (!peer || self->state.peers.count(peer.address())) return;
  self->state.peers[peer.address()] = task;
  self->monitor(peer);
}

// A worker task that joins while the job runs (its process restarted): it
// builds its replicas again and the coordinator takes them back.
void rejoin(node_ptr self, const std::string& task, const node_actor& peer) {
  spdlog::info("chief: {} is back; rebuilding its replicas", task);
  self->request(peer, std::chrono::seconds(120), build_atom::value, self->state.order)
      .then(
          [self, task](node_parts& parts) {
            auto coord = self->state.coordinator;
            for (std::size_t k = 0; k < parts.replica_indices.size(); ++k) {
              if (k < parts.replicas.size())
                caf::anon_send(coord, rejoin_atom::value, parts.replica_indices[k],
                               caf::actor_cast<caf::actor>(parts.replicas[k]));
              else if (k < parts.others.size())
                caf::anon_send(coord, rejoin_atom::value, parts.replica_indices[k],
                               parts.others[k]);
            }
          },
          [task](caf::error& e) {
            spdlog::warn("chief: {} came back but building its replicas failed: {}", task,
                         describe(e));
          });
}

node_actor::behavior_type node_impl(node_ptr self, std::shared_ptr<node_shared> shared,
                                    ring_node_actor ring, const job_config* config) {
  keep_exception_cause(self, "node actor of " + shared->task);
  self->state.shared = std::move(shared);
  self->state.config = config;
  self->state.ring = std::move(ring);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto i = st.peers.find(dm.source);
    if (i == st.peers.end()) return;
    st.shared->events.push(
        {node_event::lost, i->second, {}, {}, {}, dm.reason ? describe(dm.reason) : "exited"});
    st.peers.erase(i);
  });
  return {
      [self](challenge_atom, const std::string& task) -> caf::result<std::string> {
        const auto& s = self->current_sender();
        if (!s) return caf::make_error(caf::sec::runtime_error, "challenge: no sender");
        auto c = make_challenge();
        self->state.challenges[s->node()] = {task, c};
        return c;
      },
      [self](hello_atom, const std::string& task, const std::string& response,
             const std::string& their_challenge) -> caf::result<std::string> {
        auto& st = self->state;
        const auto& s = self->current_sender();
        if (!s) return caf::make_error(caf::sec::runtime_error, "hello: no sender");
        auto i = st.challenges.find(s->node());
        bool ok = i != st.challenges.end() && i->second.first == task &&
                  verify_challenge_response(st.shared->secret, i->second.second, task, response);
        if (i != st.challenges.end()) st.challenges.erase(i);
        if (!ok) {
          spdlog::warn("{}: refused a peer claiming to be {} ({}): wrong or missing secret",
                       st.shared->task, task, to_string(s->node()));
          return caf::make_error(caf::sec::runtime_error, st.shared->task + " refused " + task +
                                                              ": wrong or missing cluster secret");
        }
        st.trusted.insert(s->node());
        st.names[s->node()] = task;
        return challenge_response(st.shared->secret, their_challenge, st.shared->task);
      },
      [self](joined_atom, caf::actor& their_node, node_parts& parts) {
        if (!trusted_sender(self)) {
          (void)refuse(self, "joined");
          return;
        }
        auto& st = self->state;
        if (!st.shared->chief || !their_node) return;
        auto task = st.names[self->current_sender()->node()];
        spdlog::info("{}: {} joined", st.shared->task, task);
        watch_peer(self, their_node, task);
        if (st.started) {
          if (st.coordinator) {
            rejoin(self, task, caf::actor_cast<node_actor>(their_node));
          } else {
            spdlog::warn(
                "chief: {} joined while the job runs; only parameter_server and "
                "elastic_average take workers back",
                task);
            self->request(caf::actor_cast<node_actor>(their_node), std::chrono::seconds(2),
                          stop_atom::value,
                          std::string("the job was already running without this task"))
                .then([](int32_t) {}, [](caf::error&) {});
          }
          return;
        }
        parts.task = task;
        st.shared->events.push({node_event::joined, task, std::move(parts), their_node, {}, {}});
      },
      [self](build_atom, node_build& order) -> caf::result<node_parts> {
        if (!trusted_sender(self)) return refuse(self, "build");
        auto& st = self->state;
        if (st.building)
          return caf::make_error(caf::sec::runtime_error, st.shared->task + ": already building");
        st.building = self->make_response_promise<node_parts>();
        st.shared->events.push({node_event::build, {}, {}, {}, std::move(order), {}});
        return *st.building;
      },
      [self](ring_node_atom) -> caf::result<ring_node_actor> {
        if (!trusted_sender(self)) return refuse(self, "ringnode");
        if (!self->state.ring)
          return caf::make_error(caf::sec::runtime_error,
                                 self->state.shared->task + " has no ring node");
        return self->state.ring;
      },
      [self](built_atom, node_parts& parts) {
        auto& st = self->state;
        const auto& s = self->current_sender();
        if (s && s->node() != self->home_system().node()) return;
        if (st.building) st.building->deliver(std::move(parts));
        st.building.reset();
      },
      [self](built_atom, std::string& why) {
        auto& st = self->state;
        const auto& s = self->current_sender();
        if (s && s->node() != self->home_system().node()) return;
        if (st.building) st.building->deliver(build_error(st.shared->task, why));
        st.building.reset();
      },
      [self](watch_atom, caf::actor& peer, std::string& task, bool monitor) {
        const auto& s = self->current_sender();
        if (s && s->node() != self->home_system().node()) return;
        if (peer) self->state.trusted.insert(peer.node());
        if (monitor) watch_peer(self, peer, task);
      },
      [self](stop_atom, std::string& reason) -> caf::result<int32_t> {
        auto& st = self->state;
        if (!trusted_sender(self)) return refuse(self, "stop");
        const auto& s = self->current_sender();
        if (st.shared->chief && s && s->node() == self->home_system().node()) {
          int32_t told = 0;
          for (auto& [addr, task] : st.peers) {
            auto peer = caf::actor_cast<node_actor>(addr);
            if (!peer) continue;
            self->request(peer, std::chrono::seconds(2), stop_atom::value, reason)
                .then([](int32_t) {}, [](caf::error&) {});
            ++told;
          }
          return told;
        }
        st.shared->events.push({node_event::stop, {}, {}, {}, {}, std::move(reason)});
        return 0;
      },
      [self](running_atom, caf::actor& coord, node_build& order) {
        const auto& s = self->current_sender();
        if (s && s->node() != self->home_system().node()) return;
        self->state.started = true;
        // Strategies that go on without a lost worker take a restarted one back.
        if (find_strategy_rules(self->state.config->strategy.kind)->survives_lost_workers())
          self->state.coordinator = caf::actor_cast<coordinator_actor>(std::move(coord));
        self->state.order = std::move(order);
      },
  };
}

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
    return g;
  }
  const cluster_spec& spec() const { return *c.cluster; }

  // Connects to `task`'s node actor (retrying until the join deadline: the
  // peer may still be starting) and runs the mutual handshake.
  node_actor connect(const task_id& task, const node_parts& parts,
                     clock_type::time_point deadline) {
    auto it = connected.find(task.str());
    if (it != connected.end()) return it->second;
    const auto& address = task_address(spec(), task);
    auto hp = parse_host_port(address);
    node_actor peer;
    std::string last;
    for (;;) {
      bool retry = false;
      auto h = gate_remote_actor<node_actor>(sys, hp.host, hp.port, gate_opts(),
                                             std::chrono::seconds(10), &retry);
      if (h) {
        peer = std::move(*h);
        break;
      }
      last = describe(h.error());
      if (!retry) throw job_error(name() + ": joining " + task.str() + " failed: " + last);
      if (clock_type::now() >= deadline)
        throw job_error(name() + ": cannot reach " + task.str() + " at " + address + " within " +
                        fmt::format("{:g}", spec().join_timeout_seconds) + " s (" + last + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    caf::scoped_actor self{sys};
    std::string challenge;
    std::string failure;
    self->request(peer, std::chrono::seconds(10), challenge_atom::value, name())
        .receive([&](std::string& ch) { challenge = std::move(ch); },
                 [&](caf::error& e) { failure = describe(e); });
    if (!failure.empty())
      throw job_error(name() + ": handshake with " + task.str() + " failed: " + failure);
    auto mine_challenge = make_challenge();
    auto response = challenge_response(shared->secret, challenge, name());
    self->request(peer, std::chrono::seconds(10), hello_atom::value, name(), response,
                  mine_challenge)
        .receive(
            [&](std::string& theirs) {
              if (!verify_challenge_response(shared->secret, mine_challenge, task.str(), theirs))
                failure = task.str() + " did not prove it knows the cluster secret";
            },
            [&](caf::error& e) { failure = describe(e); });
    if (!failure.empty())
      throw job_error(name() + ": joining " + task.str() + " failed: " + failure);
    connected[task.str()] = peer;
    // Its requests to this process are welcome now; losing the chief ends
    // this task.
    caf::anon_send(node, watch_atom::value, caf::actor_cast<caf::actor>(peer), task.str(),
                   task.job == "chief");
    // Sent after the line above, so this process trusts the chief before the
    // chief can act on the join.
    if (task.job == "chief")
      self->send(peer, joined_atom::value, caf::actor_cast<caf::actor>(node), parts);
    spdlog::info("{}: connected to {} at {}", name(), task.str(), address);
    return peer;
  }

  // mirrored across processes: joins the ring of tasks `ring_tasks`,
  // reaching a lower rank's ring node through its node actor.
  void join_process_ring(const std::vector<std::string>& ring_tasks) {
    auto rank_it = std::find(ring_tasks.begin(), ring_tasks.end(), name());
    if (rank_it == ring_tasks.end()) throw job_error(name() + ": not in the ring it was given");
    const auto rank = static_cast<int32_t>(rank_it - ring_tasks.begin());
    const auto deadline = clock_type::now() + join_timeout;
    auto task_of = [&](int32_t p) { return ring_tasks[static_cast<std::size_t>(p)]; };
    auto ring_node_of = [&](int32_t p) -> caf::expected<ring_peer_actor> {
      auto peer = connect(parse_task_name(task_of(p)), {}, deadline);
      caf::scoped_actor self{sys};
      caf::expected<ring_peer_actor> found{caf::sec::request_timeout};
      self->request(peer, std::chrono::seconds(10), ring_node_atom::value)
          .receive([&](ring_node_actor& r) { found = ring_peer_actor{r}; },
                   [&](caf::error& e) {
                     found = caf::make_error(caf::sec::runtime_error,
                                             "ring with " + task_of(p) + ": " + describe(e));
                   });
      return found;
    };
    if (auto err = rendezvous_ring(sys, ring, rank, static_cast<int32_t>(ring_tasks.size()),
                                   ring_node_of, task_of, deadline))
      throw job_error(name() + ": joining the ring failed: " + describe(err));
    spdlog::info("{}: ring rank {} of {}", name(), rank, ring_tasks.size());
  }

  // Builds this task's replicas (with their pipelines, devices, reducers),
  // or a strategy's own workers.
  worker_parts build_workers(const node_build& order) {
    worker_spec ws;
    ws.indices = mine.replicas;
    ws.devices = mine.devices;
    ws.shards = order.shards;
    ws.place = plan_shards(*plan).place;
    ws.start_step = order.start_step;
    ws.request_timeout = kRequestTimeout;
    if (order.ring_tasks.size() > 1) {
      join_process_ring(order.ring_tasks);
      ws.ring = ring;
      ws.ring_tasks = order.ring_tasks;
    }
    ws.device_group_id = order.device_group_id;
    return spawn_job_workers(sys, plan, std::move(ws), order.hub);
  }

  node_parts parts_of(const worker_parts& w) const {
    node_parts p;
    p.task = name();
    p.replica_indices = w.indices;
    p.replicas = w.replicas;
    p.others = w.others;
    p.devices = mine.devices;
    return p;
  }
};

void stop_everything(const std::vector<variable_shard_actor>& shards, const worker_parts& workers,
                     const ring_node_actor& ring, const node_actor& node) {
  workers.stop();
  for (auto& s : shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  if (ring) caf::anon_send_exit(ring, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
}

// The chief: waits for every task to join.
void wait_for_tasks(node_process& np, std::map<std::string, node_event>& joined,
                    clock_type::time_point deadline) {
  std::vector<std::string> expected;
  for (const auto& p : np.placement)
    if (p.task.job != "chief") expected.push_back(p.task.str());
  while (joined.size() < expected.size()) {
    auto ev = np.shared->events.pop_until(deadline);
    if (!ev) {
      std::string missing, present;
      for (const auto& t : expected) {
        auto& list = joined.count(t) ? present : missing;
        list += (list.empty() ? "" : ", ") + t;
      }
      throw job_error("join timeout: after " + fmt::format("{:g}", np.spec().join_timeout_seconds) +
                      " s still waiting for " + missing +
                      (present.empty() ? "" : " (joined: " + present + ")"));
    }
    if (ev->kind == node_event::joined) {
      auto t = ev->task;
      joined[t] = std::move(*ev);
    } else if (ev->kind == node_event::lost) {
      throw job_error("task " + ev->task + " was lost while the job was starting (" + ev->reason +
                      ")");
    }
  }
  spdlog::info("chief: all {} tasks joined", expected.size() + 1);
}

// A failed job names the processes lost around its failure first: when a
// process dies, a peer's collective often fails (and reaches the
// coordinator) a moment before the chief's own connection to it drops, and
// "ring stage failed" alone hides the cause.
// "worker:1" in `text`, not as the start of "worker:10".
bool names_task(const std::string& text, const std::string& task) {
  for (auto at = text.find(task); at != std::string::npos; at = text.find(task, at + 1)) {
    const auto end = at + task.size();
    if (end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

std::string with_lost_tasks(node_process& np, const std::string& failure) {
  const auto until = clock_type::now() + std::chrono::milliseconds(300);
  while (auto ev = np.shared->events.pop_until(until))
    if (ev->kind == node_event::lost)
      return names_task(failure, ev->task)
                 ? failure
                 : "lost " + ev->task + " (" + ev->reason + "); then " + failure;
  return failure;
}

// The chief's order to every task with replicas or workers: where the job
// starts, every shard, the ring of processes and the device group, or a
// strategy's hub (job_hub::handles()).
node_build build_order(node_process& np, const shard_set& shards, const job_hub* hub) {
  const auto& c = np.c;
  const auto& strat = *np.plan->strat;
  node_build order;
  order.start_step = np.plan->start_step;
  if (hub) {
    order.hub = hub->handles();
    return order;
  }
  // Every shard by index, from this process and the tasks that host them.
  order.shards.assign(static_cast<std::size_t>(strat.has_variable_shards() ? c.strategy.shards : 0),
                      {});
  for (std::size_t k = 0; k < np.mine.shards.size(); ++k)
    order.shards[static_cast<std::size_t>(np.mine.shards[k])] = shards.actors[k];
  for (auto& [t, ev] : np.joined)
    for (std::size_t k = 0; k < ev.parts.shard_indices.size() && k < ev.parts.shards.size(); ++k)
      order.shards.at(static_cast<std::size_t>(ev.parts.shard_indices[k])) = ev.parts.shards[k];
  for (std::size_t s = 0; s < order.shards.size(); ++s)
    if (!order.shards[s]) throw job_error("no task brought variable_shard " + std::to_string(s));
  for (const auto& p : np.placement)
    if (!p.replicas.empty()) order.ring_tasks.push_back(p.task.str());
  if (!strat.reduces_across_processes() || order.ring_tasks.size() < 2) order.ring_tasks.clear();
  order.device_group_id = strat.device_group_id(c, order.ring_tasks.size());
  return order;
}

// The chief: waits for every task, spawns the coordinator (and a strategy's
// hub), orders the builds, and runs the coordinator over every process's
// replicas and shards, or the strategy's workers.
nlohmann::json run_chief(node_process& np, shard_set& shards, worker_parts& workers,
                         clock_type::time_point deadline, std::shared_ptr<job_hub>& hub) {
  const auto& c = np.c;
  auto& sys = np.sys;
  const auto& strat = *np.plan->strat;
  wait_for_tasks(np, np.joined, deadline);
  auto plan = std::make_shared<job_plan>(*np.plan);
  plan->request_timeout = kRequestTimeout;
  auto parts = std::make_shared<job_parts>();
  auto coord = sys.spawn(coordinator, std::shared_ptr<const job_plan>(plan), parts);
  if (strat.own_job()) hub = strat.spawn_hub(sys, plan, coord);
  auto order = build_order(np, shards, hub.get());

  // Builds run everywhere at once (the ring joins need every member).
  caf::scoped_actor self{sys};
  const auto build_timeout = np.join_timeout + std::chrono::seconds(60);
  std::vector<std::string> building;
  using build_reply =
      decltype(self->request(node_actor{}, build_timeout, build_atom::value, order));
  std::vector<build_reply> replies;
  for (const auto& p : np.placement)
    if (!p.replicas.empty() && p.task.job != "chief") {
      replies.push_back(self->request(caf::actor_cast<node_actor>(np.joined.at(p.task.str()).node),
                                      build_timeout, build_atom::value, order));
      building.push_back(p.task.str());
    }
  const auto n = static_cast<std::size_t>(strat.replica_count(c));
  if (!hub) {
    parts->replicas.resize(n);
    plan->replica_tasks.assign(n, "");
  }
  auto take = [&](const node_parts& built, const std::string& t) {
    for (std::size_t k = 0; k < built.replica_indices.size(); ++k) {
      if (hub) {
        if (k < built.others.size())
          parts->workers.emplace_back(built.replica_indices[k], built.others[k]);
        continue;
      }
      auto r = static_cast<std::size_t>(built.replica_indices[k]);
      parts->replicas.at(r) = built.replicas.at(k);
      plan->replica_tasks[r] = t;
    }
  };
  if (!np.mine.replicas.empty()) {
    workers = np.build_workers(order);
    take(np.parts_of(workers), "chief");
  }
  std::string failure;
  for (std::size_t k = 0; k < replies.size(); ++k)
    replies[k].receive([&](node_parts& built) { take(built, building[k]); },
                       [&](caf::error& e) {
                         if (failure.empty()) failure = building[k] + ": " + describe(e);
                       });
  if (!failure.empty())
    throw job_error(std::string("building the ") + (hub ? "actors" : "replicas") +
                    " failed: " + failure);
  for (std::size_t r = 0; r < parts->replicas.size(); ++r)
    if (!parts->replicas[r]) throw job_error("no task brought replica " + std::to_string(r));
  spdlog::info("chief: {} {}s on {} tasks, {} shards; starting", n, strat.replica_unit(),
               building.size() + (np.mine.replicas.empty() ? 0 : 1), order.shards.size());

  // The coordinator watches every actor here and every remote task: losing
  // one ends the job, except a worker task under a strategy that goes on
  // without it (its replicas are dropped instead).
  parts->others = workers.named();
  for (auto& [t, ev] : np.joined) {
    bool worker_only = ev.parts.shard_indices.empty();
    if (strat.survives_lost_workers() && worker_only) continue;
    parts->others.emplace_back("task " + t, ev.node);
  }
  parts->shards = plan_shards(*plan);
  parts->shards.actors = order.shards;
  parts->hub = hub;
  self->send(np.node, running_atom::value, caf::actor_cast<caf::actor>(coord), order);
  nlohmann::json summary;
  try {
    summary = run_coordinator(sys, coord);
  } catch (const job_error& e) {
    failure = e.what();
  }
  self->send_exit(coord, caf::exit_reason::user_shutdown);
  if (!failure.empty()) throw job_error(with_lost_tasks(np, failure));
  return summary;
}

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
// faults of `o` and those the environment names.
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
  if (fail_replica && std::sscanf(fail_replica, "%lld:%lld", &k, &step) == 2)
    faults.fail_replica = {k, step};
  faults.hold_shard_at_exit = faults.hold_shard_at_exit || hold_shard;
  return inject_faults(faults);
}

// `held_past_shutdown` gets a shard handle under the hold_shard_at_exit
// fault: the caller releases it only after the bounded shutdown.
nlohmann::json run_node_on(caf::actor_system& sys, const job_config& c, const task_id& task,
                           const job_options& o,
                           std::vector<variable_shard_actor>& held_past_shutdown) {
  const auto& spec = *c.cluster;
  const bool chief = task.job == "chief";
  auto shared = std::make_shared<node_shared>();
  shared->task = task.str();
  shared->chief = chief;
  shared->secret = load_cluster_secret(spec);
  auto placement = resolve_placement(c);
  auto mine = placement_of(placement, task);
  auto plan = make_plan(c, o, chief);
  std::optional<trace::session> tracing;  // this task's own trace file
  start_trace(tracing, c, o);
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

  auto node = sys.spawn(node_impl, shared, ring, &c);
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
    door = open_gate(sys, node, hp.host, hp.port, np.gate_opts());
  } catch (const gate_error& e) {
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    if (ring) caf::anon_send_exit(ring, caf::exit_reason::user_shutdown);
    throw job_error(task.str() + ": " + e.what());
  }
  spdlog::info("{}: listening on {}", task.str(), address);

  std::vector<variable_shard_actor> my_shards;
  shard_set shards;
  worker_parts workers;
  std::string error;
  nlohmann::json summary = nlohmann::json::object();
  const auto deadline = clock_type::now() + np.join_timeout;
  auto& events = shared->events;
  std::shared_ptr<job_hub> hub;  // chief of a strategy with a job of its own
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
      for (bool done = false; !done;) {
        auto ev = events.pop_until(clock_type::time_point::max());
        if (!ev) continue;
        switch (ev->kind) {
          case node_event::build:
            try {
              workers = np.build_workers(ev->order);
              caf::anon_send(node, built_atom::value, np.parts_of(workers));
              spdlog::info("{}: built {}s {}", task.str(), plan->strat->replica_unit(),
                           fmt::join(workers.indices, ", "));
            } catch (const std::exception& e) {
              caf::anon_send(node, built_atom::value, std::string(e.what()));
              throw;
            }
            break;
          case node_event::stop:
            if (!ev->reason.empty()) error = "the chief ended the job: " + ev->reason;
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
      summary = run_chief(np, shards, workers, deadline, hub);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (chief) {
    // Every task that joined, restarted ones included, learns the end.
    caf::scoped_actor self{sys};
    self->request(node, std::chrono::seconds(5), stop_atom::value, error)
        .receive([](int32_t) {}, [](caf::error&) {});
  }
  if (hub) hub->stop();
  stop_everything(my_shards, workers, ring, node);
  door.reset();
  auto devices = std::move(workers.devices);
  workers = {};
  my_shards.clear();
  shards = {};
  np.joined.clear();
  sys.await_all_actors_done();
  devices.clear();
  hub.reset();
  if (!error.empty())
    throw job_error(error.rfind(task.str(), 0) == 0 ? error : task.str() + ": " + error);
  finish_trace(tracing, summary);
  if (chief) std::ofstream(fs::path(plan->output_dir) / "summary.json") << summary.dump(2) << '\n';
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
