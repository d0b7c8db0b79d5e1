// troupe node's node actor: the mutual handshake, the chief's build orders,
// joins, rejoins and stops, handed to the process's main thread as events.
#include <spdlog/spdlog.h>

#include <map>
#include <set>

#include "actors/failure.hpp"
#include "config/secret.hpp"
#include "runtime/coordinator.hpp"
#include "runtime/node_process.hpp"
#include "strategies/strategy.hpp"

namespace troupe::node_detail {

namespace {

struct node_state {
  std::shared_ptr<node_shared> shared;
  ring_node_actor ring;
  // Per peer process: the task it claims and the challenge it was given.
  std::map<caf::node_id, std::pair<std::string, std::string>> challenges;
  std::set<caf::node_id> trusted;
  std::map<caf::node_id, std::string> names;     // trusted peer -> its task
  std::map<caf::actor_addr, std::string> peers;  // monitored node actors -> task
  std::optional<caf::typed_response_promise<node_parts>> building;
  // Chief, once the job runs: its coordinator (where preemptions and
  // rejoining workers go), and a task's preemption that came before it ran.
  bool started = false;
  coordinator_actor coordinator;
  std::string early_preemption;
  // A task: the chief's node actor, once connected.
  node_actor chief;
  node_build order;
  const job_config* config = nullptr;
  static inline const char* name = "node";
};

using node_ptr = node_actor::stateful_pointer<node_state>;

// Whether the job goes on without a lost worker task and takes it back when
// it starts again (parameter_server, elastic_average, actor_learner).
bool takes_workers_back(const node_state& st) {
  return find_strategy_rules(st.config->strategy.kind)->survives_lost_workers();
}

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

// A task asked to leave (SIGTERM, SIGUSR1): the whole job stops at its next
// update with a checkpoint, all tasks exit with the "resume me" status, and
// the same commands resume it. From this process's signal watch, a task tells
// the chief (the chief's own coordinator heard the signal itself); from a
// peer, the chief tells its coordinator. A worker that the job can lose
// (parameter_server, elastic_average, actor_learner) leaves alone instead.
void on_preempt(node_ptr self, std::string signal) {
  auto& st = self->state;
  const auto& s = self->current_sender();
  if (!s || s->node() == self->home_system().node()) {
    if (st.shared->chief || !st.chief) return;
    // A worker of a strategy that goes on without it (and takes it back when
    // it starts again) just leaves.
    if (st.shared->task.rfind("worker", 0) == 0 && takes_workers_back(st)) {
      spdlog::warn("{}: {}: leaving; the job goes on and takes this task back when it starts again",
                   st.shared->task, signal);
      node_event ev{node_event::stop, {}, {}, {}, {}, {}, {}};
      ev.preempted = std::move(signal);
      st.shared->events.push(std::move(ev));
      return;
    }
    spdlog::warn("{}: {}: asking the chief to stop the job with a checkpoint", st.shared->task,
                 signal);
    self->send(st.chief, preempt_atom::value, signal + " to " + st.shared->task);
    return;
  }
  if (!trusted_sender(self)) {
    (void)refuse(self, "preempt");
    return;
  }
  if (!st.shared->chief) return;
  if (st.coordinator)
    caf::anon_send(st.coordinator, preempt_atom::value, std::move(signal));
  else if (st.early_preemption.empty())
    st.early_preemption = std::move(signal);
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
        {node_event::lost, i->second, {}, {}, {}, dm.reason ? describe(dm.reason) : "exited", {}});
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
        bool ok =
            i != st.challenges.end() && i->second.first == task &&
            verify_challenge_response(st.shared->handshake_key, i->second.second, task, response);
        if (i != st.challenges.end()) st.challenges.erase(i);
        if (!ok) {
          spdlog::warn("{}: refused a peer claiming to be {} ({}): wrong or missing secret",
                       st.shared->task, task, to_string(s->node()));
          return caf::make_error(caf::sec::runtime_error, st.shared->task + " refused " + task +
                                                              ": wrong or missing cluster secret");
        }
        st.trusted.insert(s->node());
        st.names[s->node()] = task;
        return challenge_response(st.shared->handshake_key, their_challenge, st.shared->task);
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
          if (takes_workers_back(st)) {
            rejoin(self, task, caf::actor_cast<node_actor>(their_node));
          } else {
            spdlog::warn(
                "chief: {} joined while the job runs; only parameter_server and "
                "elastic_average take workers back",
                task);
            self->request(caf::actor_cast<node_actor>(their_node), std::chrono::seconds(2),
                          stop_atom::value,
                          std::string("the job was already running without this task"),
                          std::string())
                .then([](int32_t) {}, [](caf::error&) {});
          }
          return;
        }
        parts.task = task;
        st.shared->events.push(
            {node_event::joined, task, std::move(parts), their_node, {}, {}, {}});
      },
      [self](build_atom, node_build& order) -> caf::result<node_parts> {
        if (!trusted_sender(self)) return refuse(self, "build");
        auto& st = self->state;
        if (st.building)
          return caf::make_error(caf::sec::runtime_error, st.shared->task + ": already building");
        st.building = self->make_response_promise<node_parts>();
        st.shared->events.push({node_event::build, {}, {}, {}, std::move(order), {}, {}});
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
        if (monitor && task.rfind("chief", 0) == 0)
          self->state.chief = caf::actor_cast<node_actor>(peer);
      },
      [self](stop_atom, std::string& reason, std::string& preempted) -> caf::result<int32_t> {
        auto& st = self->state;
        if (!trusted_sender(self)) return refuse(self, "stop");
        const auto& s = self->current_sender();
        if (st.shared->chief && s && s->node() == self->home_system().node()) {
          // The answer waits for every task's (or its 2 s timeout): the
          // chief tears its connections down after it, and a stop still on
          // its way would be lost, the task then seeing its chief vanish.
          std::vector<node_actor> peers;
          for (auto& [addr, task] : st.peers)
            if (auto peer = caf::actor_cast<node_actor>(addr)) peers.push_back(std::move(peer));
          const auto told = static_cast<int32_t>(peers.size());
          if (told == 0) return told;
          auto rp = self->make_response_promise<int32_t>();
          auto pending = std::make_shared<int32_t>(told);
          auto answered = [rp, pending, told]() mutable {
            if (--*pending == 0) rp.deliver(told);
          };
          for (auto& peer : peers)
            self->request(peer, std::chrono::seconds(2), stop_atom::value, reason, preempted)
                .then([answered](int32_t) mutable { answered(); },
                      [answered](caf::error&) mutable { answered(); });
          return rp;
        }
        node_event ev{node_event::stop, {}, {}, {}, {}, std::move(reason), {}};
        ev.preempted = std::move(preempted);
        st.shared->events.push(std::move(ev));
        return 0;
      },
      [self](preempt_atom, std::string& signal) { on_preempt(self, std::move(signal)); },
      [self](running_atom, caf::actor& coord, node_build& order) {
        const auto& s = self->current_sender();
        if (s && s->node() != self->home_system().node()) return;
        auto& st = self->state;
        st.started = true;
        st.coordinator = caf::actor_cast<coordinator_actor>(std::move(coord));
        if (!st.early_preemption.empty())
          caf::anon_send(st.coordinator, preempt_atom::value,
                         std::exchange(st.early_preemption, {}));
        st.order = std::move(order);
      },
  };
}

}  // namespace

node_actor spawn_node_actor(caf::actor_system& sys, std::shared_ptr<node_shared> shared,
                            ring_node_actor ring, const job_config* config) {
  return sys.spawn(node_impl, std::move(shared), std::move(ring), config);
}

}  // namespace troupe::node_detail
