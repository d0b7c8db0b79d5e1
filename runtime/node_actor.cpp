// troupe node's node actor: the mutual handshake, the chief's build orders,
// joins, rejoins and stops, handed to the process's main thread as events.
//
// Threat model: any holder of the cluster secret can pass a gate and address
// this actor by its id, with or without a sender (BASP's source actor 0),
// under any task name that is not connected (net/basp_guard.hpp). So
// every message is taken only from the role that sends it (may_send below),
// a peer's role is the task its connection authenticated as and proved
// again in the node handshake, a task's chief is the process it dialed, and
// everything refused is logged at warning naming the sender.
#include <spdlog/spdlog.h>

#include <map>
#include <set>

#include "actors/failure.hpp"
#include "config/secret.hpp"
#include "net/basp_guard.hpp"
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
  // Peers that completed the node handshake (either way), by node: their
  // task. Nothing else from another node is obeyed.
  std::map<caf::node_id, std::string> names;
  std::map<caf::actor_addr, std::string> peers;  // monitored node actors -> task
  std::optional<caf::typed_response_promise<node_parts>> building;
  // Chief, once the job runs: its coordinator (where preemptions and
  // rejoining workers go), and a task's preemption that came before it ran.
  bool started = false;
  coordinator_actor coordinator;
  std::string early_preemption;
  // A task: the chief's node actor, once connected.
  node_actor chief;
  // The job is ending (the stop came): peers leaving are expected now.
  bool ending = false;
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

// Who may send each control message (issue 40): the role that sends it,
// and never an anonymous sender (a BASP message with source actor 0 has
// none; this process's own threads send with one, runtime/local_send.hpp).
enum class may_send {
  here,   // this process: its main thread, its signal watch, the chief's run
  chief,  // the chief's node actor, once the handshake made it a peer
  task,   // another task's node actor (not a chief's), idem
  peer,   // any task that completed the handshake
};

const char* role_text(may_send who) {
  switch (who) {
    case may_send::here:
      return "this process";
    case may_send::chief:
      return "the chief";
    case may_send::task:
      return "a task other than the chief";
    case may_send::peer:
      return "a task that completed the node handshake";
  }
  return "nobody";
}

bool is_chief(const std::string& task) {
  return task.rfind("chief", 0) == 0;
}

// The sender of the message now handled: this process, a peer's task (once
// it completed the handshake) or neither; `who` names it for the log.
struct sender_view {
  bool local = false;
  std::string task;
  caf::node_id node;
  std::string who;
};

sender_view sender_of(node_ptr self) {
  sender_view v;
  const auto& s = self->current_sender();
  if (!s) {
    v.who = "an anonymous sender (no source actor)";
  } else if (s->node() == self->home_system().node()) {
    v.local = true;
    v.who = "this process";
  } else if (auto i = self->state.names.find(s->node()); i != self->state.names.end()) {
    v.task = i->second;
    v.node = s->node();
    v.who = v.task + " (node " + to_string(s->node()) + ")";
  } else {
    auto live = live_task_of(self->home_system().node(), s->node());
    v.who = (live.empty() ? "" : "a connection as " + live + ", ") + "node " +
            to_string(s->node()) + ", which has not completed the node handshake";
  }
  return v;
}

// "The chief" of a task is the process it dialed at the chief's address
// and made the handshake with, never a peer that dialed in under a chief's
// name (with a pre-shared key, a name any holder of the secret can claim).
bool sent_by(node_ptr self, const sender_view& v, may_send who) {
  switch (who) {
    case may_send::here:
      return v.local;
    case may_send::chief:
      return !v.task.empty() && is_chief(v.task) &&
             (self->state.shared->chief ||
              (self->state.chief && v.node == self->state.chief.node()));
    case may_send::task:
      return !v.task.empty() && !is_chief(v.task);
    case may_send::peer:
      return !v.task.empty();
  }
  return false;
}

// Empty when the message now handled (`what`) comes from `who`; else the
// refusal for the sender, logged at warning naming it.
std::optional<caf::error> refused(node_ptr self, const char* what, may_send who) {
  auto v = sender_of(self);
  if (sent_by(self, v, who)) return std::nullopt;
  const auto& me = self->state.shared->task;
  spdlog::warn("{}: refused '{}' from {}: only {} may send it", me, what, v.who, role_text(who));
  const bool stranger = !v.local && v.task.empty();
  return caf::make_error(caf::sec::runtime_error,
                         me + ": '" + what + "' refused: " +
                             (stranger ? std::string("not authenticated")
                                       : std::string("not from ") + role_text(who)));
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
                self->send(coord, rejoin_atom::value, parts.replica_indices[k],
                           caf::actor_cast<caf::actor>(parts.replicas[k]));
              else if (k < parts.others.size())
                self->send(coord, rejoin_atom::value, parts.replica_indices[k], parts.others[k]);
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
  if (refused(self, "preempt", st.shared->chief ? may_send::task : may_send::here)) return;
  if (st.shared->chief) {
    if (st.coordinator)
      self->send(st.coordinator, preempt_atom::value, std::move(signal));
    else if (st.early_preemption.empty())
      st.early_preemption = std::move(signal);
    return;
  }
  if (!st.chief) return;
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
}

// The node handshake (config/secret.hpp), first half: a challenge for the
// peer that asks, remembered with the task it claims.
caf::result<std::string> on_challenge(node_ptr self, const std::string& task) {
  const auto& s = self->current_sender();
  if (!s || s->node() == self->home_system().node()) {
    spdlog::warn("{}: refused 'challenge' from {}: only a peer process may ask",
                 self->state.shared->task, sender_of(self).who);
    return caf::make_error(caf::sec::runtime_error, "challenge: not from a peer");
  }
  auto c = make_challenge();
  self->state.challenges[s->node()] = {task, c};
  return c;
}

// Second half: the peer proves the secret for the task it claims, and that
// task is the one its connection authenticated as (the gate and TLS,
// net/basp_guard.hpp: live_task_of), so a holder of the secret on one
// connection cannot speak as another task.
caf::result<std::string> on_hello(node_ptr self, const std::string& task,
                                  const std::string& response, const std::string& their_challenge) {
  auto& st = self->state;
  const auto& s = self->current_sender();
  if (!s || s->node() == self->home_system().node()) {
    spdlog::warn("{}: refused 'hello' from {}: only a peer process may send it", st.shared->task,
                 sender_of(self).who);
    return caf::make_error(caf::sec::runtime_error, "hello: not from a peer");
  }
  auto i = st.challenges.find(s->node());
  bool ok = i != st.challenges.end() && i->second.first == task &&
            verify_challenge_response(st.shared->handshake_key, i->second.second, task, response);
  if (i != st.challenges.end()) st.challenges.erase(i);
  if (!ok) {
    spdlog::warn("{}: refused a peer claiming to be {} ({}): wrong or missing secret",
                 st.shared->task, task, to_string(s->node()));
    return caf::make_error(caf::sec::runtime_error, st.shared->task + " refused " + task +
                                                        ": wrong or missing cluster secret");
  }
  const auto proven = live_task_of(self->home_system().node(), s->node());
  if (proven != task) {
    const auto as =
        proven.empty() ? std::string("no live connection") : "its connection as " + proven;
    spdlog::warn("{}: refused a peer claiming to be {} ({}): it came over {}", st.shared->task,
                 task, to_string(s->node()), as);
    return caf::make_error(caf::sec::runtime_error,
                           st.shared->task + " refused " + task + ": it came over " + as);
  }
  st.names[s->node()] = task;
  return challenge_response(st.shared->handshake_key, their_challenge, st.shared->task);
}

// The chief: a task joined (or, while the job runs, came back).
void on_joined(node_ptr self, caf::actor& their_node, node_parts& parts) {
  auto& st = self->state;
  if (refused(self, "joined", may_send::task) || !st.shared->chief || !their_node) return;
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
                    stop_atom::value, std::string("the job was already running without this task"),
                    std::string())
          .then([](int32_t) {}, [](caf::error&) {});
    }
    return;
  }
  parts.task = task;
  st.shared->events.push({node_event::joined, task, std::move(parts), their_node, {}, {}, {}});
}

// This process's main thread finished a build (`parts`) or failed (`why`).
template <class Outcome>  // node_parts, or caf::error
void on_built(node_ptr self, Outcome outcome) {
  auto& st = self->state;
  if (refused(self, "built", may_send::here)) return;
  if (st.building) st.building->deliver(std::move(outcome));
  st.building.reset();
}

// The chief's own run: tell every task that joined, answering once each
// answered (or its 2 s timeout): the chief tears its connections down after
// it, and a stop still on its way would be lost, the task then seeing its
// chief vanish.
caf::result<int32_t> stop_every_task(node_ptr self, const std::string& reason,
                                     const std::string& preempted) {
  std::vector<node_actor> peers;
  for (auto& [addr, task] : self->state.peers)
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

// The job is over: on the chief from its own run, on a task from the chief.
caf::result<int32_t> on_stop(node_ptr self, std::string& reason, std::string& preempted) {
  auto& st = self->state;
  if (auto no = refused(self, "stop", st.shared->chief ? may_send::here : may_send::chief))
    return std::move(*no);
  st.ending = true;
  if (st.shared->chief) return stop_every_task(self, reason, preempted);
  node_event ev{node_event::stop, {}, {}, {}, {}, std::move(reason), {}};
  ev.preempted = std::move(preempted);
  st.shared->events.push(std::move(ev));
  return 0;
}

// This process connected to `peer` (task `task`) and checked its response:
// a peer from now on; with `monitor`, its loss ends this task.
void on_watch(node_ptr self, caf::actor& peer, const std::string& task, bool monitor) {
  if (refused(self, "watch", may_send::here) || !peer) return;
  self->state.names[peer.node()] = task;
  if (monitor) watch_peer(self, peer, task);
  if (monitor && is_chief(task)) self->state.chief = caf::actor_cast<node_actor>(peer);
}

// The chief's run started its coordinator.
void on_running(node_ptr self, caf::actor& coord, node_build& order) {
  auto& st = self->state;
  if (refused(self, "running", may_send::here) || !st.shared->chief) return;
  st.started = true;
  st.coordinator = caf::actor_cast<coordinator_actor>(std::move(coord));
  if (!st.early_preemption.empty())
    self->send(st.coordinator, preempt_atom::value, std::exchange(st.early_preemption, {}));
  st.order = std::move(order);
}

// A watched peer's node actor is gone: said at once, naming the task (at
// warning unless the job is ending), and handed to the main thread, which
// ends this task or the job (or, for a worker the strategy can lose, goes
// on).
void on_peer_down(node_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  auto i = st.peers.find(dm.source);
  if (i == st.peers.end()) return;
  const auto why = dm.reason ? describe(dm.reason) : std::string("exited");
  if (st.ending)
    spdlog::info("{}: {} left ({})", st.shared->task, i->second, why);
  else
    spdlog::warn("{}: lost {} ({})", st.shared->task, i->second, why);
  st.shared->events.push({node_event::lost, i->second, {}, {}, {}, why, {}});
  st.peers.erase(i);
}

node_actor::behavior_type node_impl(node_ptr self, std::shared_ptr<node_shared> shared,
                                    ring_node_actor ring, const job_config* config) {
  keep_exception_cause(self, "node actor of " + shared->task);
  self->state.shared = std::move(shared);
  self->state.config = config;
  self->state.ring = std::move(ring);
  self->set_down_handler([self](caf::down_msg& dm) { on_peer_down(self, dm); });
  return {
      [self](challenge_atom, const std::string& task) { return on_challenge(self, task); },
      [self](hello_atom, const std::string& task, const std::string& response,
             const std::string& their_challenge) {
        return on_hello(self, task, response, their_challenge);
      },
      [self](joined_atom, caf::actor& their_node, node_parts& parts) {
        on_joined(self, their_node, parts);
      },
      [self](build_atom, node_build& order) -> caf::result<node_parts> {
        if (auto no = refused(self, "build", may_send::chief)) return std::move(*no);
        auto& st = self->state;
        if (st.building)
          return caf::make_error(caf::sec::runtime_error, st.shared->task + ": already building");
        st.building = self->make_response_promise<node_parts>();
        st.shared->events.push({node_event::build, {}, {}, {}, std::move(order), {}, {}});
        return *st.building;
      },
      [self](ring_node_atom) -> caf::result<ring_node_actor> {
        if (auto no = refused(self, "ringnode", may_send::peer)) return std::move(*no);
        if (!self->state.ring)
          return caf::make_error(caf::sec::runtime_error,
                                 self->state.shared->task + " has no ring node");
        return self->state.ring;
      },
      [self](built_atom, node_parts& parts) { on_built(self, std::move(parts)); },
      [self](built_atom, std::string& why) {
        on_built(self, build_error(self->state.shared->task, why));
      },
      [self](watch_atom, caf::actor& peer, std::string& task, bool monitor) {
        on_watch(self, peer, task, monitor);
      },
      [self](stop_atom, std::string& reason, std::string& preempted) {
        return on_stop(self, reason, preempted);
      },
      [self](preempt_atom, std::string& signal) { on_preempt(self, std::move(signal)); },
      [self](running_atom, caf::actor& coord, node_build& order) {
        on_running(self, coord, order);
      },
  };
}

}  // namespace

node_actor spawn_node_actor(caf::actor_system& sys, std::shared_ptr<node_shared> shared,
                            ring_node_actor ring, const job_config* config) {
  return sys.spawn(node_impl, std::move(shared), std::move(ring), config);
}

}  // namespace troupe::node_detail
