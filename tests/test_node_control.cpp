// Who may send each control message of troupe node (issue 40, "each task is
// who it says it is"): every atom of the node actor (runtime/node_actor.cpp)
// is sent, over real gated links, anonymously (a BASP message with source
// actor 0, what a holder of the secret sends without the node handshake:
// dropped by the receiver's guard), from a connection that skipped the handshake, from the wrong
// role and from the right one: refused and logged at warning naming the sender, or accepted. The
// processes of a cluster are actor systems of this process.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/net_system_config.hpp"
#include "config/secret.hpp"
#include "net/gate.hpp"
#include "net/secure_link.hpp"
#include "runtime/coordinator.hpp"
#include "runtime/local_send.hpp"
#include "runtime/node_process.hpp"
#include "runtime/stall_watch.hpp"
#include "runtime/topology.hpp"
#include "tests/attack.hpp"
#include "tests/captured_log.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
using namespace troupe::node_detail;
using troupe::attack::eventually;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr const char* kSecret = "control-test-secret-0123456789abcdef";
constexpr auto kWait = std::chrono::seconds(5);
// Dialing a gate and BASP's handshake: a hang guard only (a loaded machine
// took over 5 s once, at load average ~10).
constexpr auto kDial = std::chrono::seconds(30);

troupe::test::ring_log logs;  // (installed before any actor system starts)

bool logged(const std::string& text) {
  return eventually([&] { return logs.contains(text); }, std::chrono::seconds(5));
}

// One process of a cluster: its actor system and its node actor behind a
// gate, as troupe node runs them.
struct host {
  // BASP drops a connection silent for its connection timeout (2 s by
  // default); no case here waits on that, and a loaded machine once left a
  // handshake silent longer.
  net_system_config cfg{std::chrono::milliseconds(200), std::chrono::seconds(20)};
  caf::actor_system sys{cfg};
  job_config config;
  std::shared_ptr<node_shared> shared = std::make_shared<node_shared>();
  node_actor node;
  std::unique_ptr<gate> door;

  explicit host(const std::string& task) {
    config.strategy.kind = "mirrored";
    shared->task = task;
    shared->chief = task.rfind("chief", 0) == 0;
    shared->secret = kSecret;
    shared->handshake_key = derive_key(kSecret, key_purpose::node_handshake);
    node = spawn_node_actor(sys, shared, {}, &config);
    gate_options o;
    o.secret = kSecret;
    o.name = task;
    door = open_gate(sys, node, "127.0.0.1", 0, std::move(o));
  }
  ~host() {
    door.reset();
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  }

  // `other`'s node actor, reached through its gate as this task; with
  // `handshake`, after the node handshake (each side then takes the other
  // for its task; losing the chief would end this task).
  node_actor dial(host& other, bool handshake) {
    gate_options o;
    o.secret = kSecret;
    o.name = shared->task;
    o.expect_peer = other.shared->task;
    auto h = gate_remote_actor<node_actor>(sys, "127.0.0.1", other.door->port(), o, kDial);
    REQUIRE_MESSAGE(h, sys.render(h.error()));
    if (handshake) {
      auto failure = node_handshake(sys, node, *h, shared->task, other.shared->task,
                                    shared->handshake_key, other.shared->chief);
      REQUIRE_MESSAGE(failure.empty(), failure);
    }
    return *h;
  }

  // Sends `xs` to `to` from an actor of this process.
  template <class... Ts>
  void tell(const node_actor& to, Ts&&... xs) {
    send_from_here(sys, to, std::forward<Ts>(xs)...);
  }
  // The same without a sender: over BASP, a message with source actor 0,
  // which the receiver's guard drops (net/basp_guard.hpp) before its
  // node actor sees it. Whether it was dropped and logged so.
  template <class... Ts>
  bool tell_anonymously(const node_actor& to, Ts&&... xs) {
    const auto dropped = link_totals().frames_dropped;
    caf::anon_send(caf::actor_cast<caf::actor>(to), std::forward<Ts>(xs)...);
    return eventually([&] { return link_totals().frames_dropped > dropped; }, kWait) &&
           logged("a direct_message without a sender (source actor 0)");
  }
  // Asks `to` for a `Reply` to `xs`: "ok", or the error.
  template <class Reply, class... Ts>
  std::string ask(const node_actor& to, Ts&&... xs) {
    caf::scoped_actor self{sys};
    std::string out = "no answer";
    self->request(caf::actor_cast<caf::actor>(to), kWait, std::forward<Ts>(xs)...)
        .receive([&](Reply&) { out = "ok"; }, [&](caf::error& e) { out = describe(e); });
    return out;
  }

  // The next event this process's node actor hands its main thread.
  std::optional<node_event> next_event(std::chrono::milliseconds limit = kWait) {
    return shared->events.pop_until(clock_type::now() + limit);
  }
};

// A chief and worker:0 that joined it, as troupe node connects them; a
// holder of the secret that passed both gates as worker:2 but never made
// the node handshake; worker:1, a peer of worker:0 (the ring's kind).
struct cluster {
  host chief{"chief:0"}, worker{"worker:0"}, stranger{"worker:2"}, other{"worker:1"};
  node_actor chief_at_worker;                        // the chief's node actor, in worker:0's system
  node_actor worker_at_chief;                        // worker:0's, in the chief's
  node_actor worker_at_other;                        // worker:0's, in worker:1's (handshaken)
  node_actor chief_at_stranger, worker_at_stranger;  // no node handshake

  cluster() {
    chief_at_worker = worker.dial(chief, true);
    worker.tell(chief_at_worker, joined_atom::value, caf::actor_cast<caf::actor>(worker.node),
                node_parts{});
    auto joined = chief.next_event();
    REQUIRE(joined);
    REQUIRE(joined->kind == node_event::joined);
    CHECK(joined->task == "worker:0");
    worker_at_chief = caf::actor_cast<node_actor>(joined->node);
    worker_at_other = other.dial(worker, true);
    chief_at_stranger = stranger.dial(chief, false);
    worker_at_stranger = stranger.dial(worker, false);
  }
};

// A coordinator's stand-in on the chief: what its node actor passes on.
struct coordinator_stub {
  std::mutex mutex;
  std::vector<std::string> preemptions;
  std::vector<std::string> got() {
    std::lock_guard<std::mutex> guard(mutex);
    return preemptions;
  }
};

caf::actor spawn_coordinator_stub(caf::actor_system& sys, coordinator_stub* stub) {
  return sys.spawn(
      [](caf::event_based_actor*, coordinator_stub* s) -> caf::behavior {
        return {[s](preempt_atom, const std::string& signal) {
          std::lock_guard<std::mutex> guard(s->mutex);
          s->preemptions.push_back(signal);
        }};
      },
      stub);
}

}  // namespace

TEST_CASE("control 'build': to a task from its chief only") {
  cluster c;
  CHECK(c.stranger.tell_anonymously(c.worker_at_stranger, build_atom::value, node_build{}));
  CHECK(c.stranger.ask<node_parts>(c.worker_at_stranger, build_atom::value, node_build{})
            .find("'build' refused: not authenticated") != std::string::npos);
  CHECK(logged("worker:0: refused 'build' from a connection as worker:2"));
  CHECK(c.other.ask<node_parts>(c.worker_at_other, build_atom::value, node_build{})
            .find("'build' refused: not from the chief") != std::string::npos);
  CHECK(logged("worker:0: refused 'build' from worker:1"));
  // A holder of the secret dialing a task as chief:0 (with a pre-shared
  // key the name is all it proves): refused at the gate while the chief's
  // connection is live, and elsewhere not taken for the chief (a task's
  // chief is the process it dialed).
  host impostor("chief:0"), lone("worker:5");
  gate_options as_chief;
  as_chief.secret = kSecret;
  as_chief.name = "chief:0";
  as_chief.expect_peer = "worker:0";
  CHECK_FALSE(gate_remote_actor<node_actor>(impostor.sys, "127.0.0.1", c.worker.door->port(),
                                            as_chief, kWait));
  CHECK(logged("worker:0: refused a peer claiming to be chief:0"));
  auto lone_at_impostor = impostor.dial(lone, true);
  CHECK(impostor.ask<node_parts>(lone_at_impostor, build_atom::value, node_build{})
            .find("'build' refused: not from the chief") != std::string::npos);
  CHECK(logged("worker:5: refused 'build' from chief:0 (node"));
  CHECK_FALSE(c.worker.next_event(std::chrono::milliseconds(300)));
  // From the chief: the worker's main thread builds, and says so.
  // (A future: its destructor waits for the answer, also when a check fails.)
  auto reply = std::async(std::launch::async, [&] {
    return c.chief.ask<node_parts>(c.worker_at_chief, build_atom::value, node_build{});
  });
  auto ev = c.worker.next_event();
  REQUIRE(ev);
  CHECK(ev->kind == node_event::build);
  c.worker.tell(c.worker.node, built_atom::value, node_parts{});
  CHECK(reply.get() == "ok");
}

TEST_CASE("control 'built': from this process only") {
  cluster c;
  // (A future: its destructor waits for the answer, also when a check fails.)
  auto reply = std::async(std::launch::async, [&] {
    return c.chief.ask<node_parts>(c.worker_at_chief, build_atom::value, node_build{});
  });
  REQUIRE(c.worker.next_event());
  // A forged "built" would answer the chief's build with the sender's parts.
  CHECK(c.stranger.tell_anonymously(c.worker_at_stranger, built_atom::value, node_parts{}));
  c.other.tell(c.worker_at_other, built_atom::value, std::string("forged failure"));
  CHECK(logged("worker:0: refused 'built' from worker:1"));
  c.chief.tell(c.worker_at_chief, built_atom::value, node_parts{});
  CHECK(logged("worker:0: refused 'built' from chief:0"));
  CHECK(reply.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);  // building
  c.worker.tell(c.worker.node, built_atom::value, std::string("out of memory"));
  CHECK(reply.get().find("worker:0: out of memory") != std::string::npos);
}

TEST_CASE("control 'stop': to a task from its chief only") {
  cluster c;
  CHECK(c.stranger.tell_anonymously(c.worker_at_stranger, stop_atom::value, std::string("x"),
                                    std::string()));
  CHECK(c.other.ask<int32_t>(c.worker_at_other, stop_atom::value, std::string("x"), std::string())
            .find("'stop' refused: not from the chief") != std::string::npos);
  CHECK(logged("worker:0: refused 'stop' from worker:1"));
  CHECK_FALSE(c.worker.next_event(std::chrono::milliseconds(300)));
  CHECK(c.chief.ask<int32_t>(c.worker_at_chief, stop_atom::value, std::string("done"),
                             std::string()) == "ok");
  auto ev = c.worker.next_event();
  REQUIRE(ev);
  CHECK(ev->kind == node_event::stop);
  CHECK(ev->reason == "done");
}

TEST_CASE("control 'stop': to the chief from its own process only") {
  cluster c;
  CHECK(c.stranger.tell_anonymously(c.chief_at_stranger, stop_atom::value, std::string("x"),
                                    std::string()));
  CHECK(c.worker.ask<int32_t>(c.chief_at_worker, stop_atom::value, std::string("x"), std::string())
            .find("'stop' refused: not from this process") != std::string::npos);
  CHECK(logged("chief:0: refused 'stop' from worker:0"));
  CHECK_FALSE(c.worker.next_event(std::chrono::milliseconds(300)));
  // From the chief's run: every task that joined is told.
  CHECK(c.chief.ask<int32_t>(c.chief.node, stop_atom::value, std::string(), std::string()) == "ok");
  auto ev = c.worker.next_event();
  REQUIRE(ev);
  CHECK(ev->kind == node_event::stop);
}

// Issue 40, row 3: an anonymous BASP message carrying preempt_atom, with no
// node handshake, preempted the whole job with the sender's text.
TEST_CASE("control 'preempt': to a task from its own process only, to the chief from a task") {
  cluster c;
  coordinator_stub stub;
  auto coordinator = spawn_coordinator_stub(c.chief.sys, &stub);
  c.chief.tell(c.chief.node, running_atom::value, coordinator, node_build{});
  CHECK(c.stranger.tell_anonymously(c.worker_at_stranger, preempt_atom::value,
                                    std::string("chosen by the attacker")));
  CHECK(c.stranger.tell_anonymously(c.chief_at_stranger, preempt_atom::value,
                                    std::string("chosen by the attacker")));
  c.stranger.tell(c.chief_at_stranger, preempt_atom::value, std::string("chosen by the attacker"));
  CHECK(logged("chief:0: refused 'preempt' from a connection as worker:2"));
  c.chief.tell(c.worker_at_chief, preempt_atom::value, std::string("from the chief"));
  CHECK(logged("worker:0: refused 'preempt' from chief:0"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(stub.got().empty());
  // worker:0's signal watch: its node actor asks the chief, which stops the
  // job with a checkpoint.
  c.worker.tell(c.worker.node, preempt_atom::value, std::string("SIGTERM"));
  CHECK(eventually([&] { return stub.got() == std::vector<std::string>{"SIGTERM to worker:0"}; }));
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
}

TEST_CASE("control 'running': from the chief's own process only") {
  cluster c;
  coordinator_stub stub, rogue;
  auto coordinator = spawn_coordinator_stub(c.chief.sys, &stub);
  auto impostor = spawn_coordinator_stub(c.stranger.sys, &rogue);
  // A coordinator of the sender's choosing would get the job's preemptions
  // and its rejoining workers.
  CHECK(c.stranger.tell_anonymously(c.chief_at_stranger, running_atom::value, impostor,
                                    node_build{}));
  c.worker.tell(c.chief_at_worker, running_atom::value, caf::actor{}, node_build{});
  CHECK(logged("chief:0: refused 'running' from worker:0"));
  c.worker.tell(c.worker.node, preempt_atom::value, std::string("SIGTERM"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(rogue.got().empty());
  // The chief's run: the preemption that came before reaches its coordinator.
  c.chief.tell(c.chief.node, running_atom::value, coordinator, node_build{});
  CHECK(eventually([&] { return stub.got() == std::vector<std::string>{"SIGTERM to worker:0"}; }));
  CHECK(rogue.got().empty());
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impostor, caf::exit_reason::user_shutdown);
}

TEST_CASE("control 'watch': from this process only") {
  cluster c;
  // A forged watch would make worker:0 trust the sender as its chief.
  CHECK(c.stranger.tell_anonymously(c.worker_at_stranger, watch_atom::value,
                                    caf::actor_cast<caf::actor>(c.stranger.node),
                                    std::string("chief:0"), true));
  c.other.tell(c.worker_at_other, watch_atom::value, caf::actor_cast<caf::actor>(c.other.node),
               std::string("chief:0"), true);
  CHECK(logged("worker:0: refused 'watch' from worker:1"));
  CHECK(c.stranger.ask<node_parts>(c.worker_at_stranger, build_atom::value, node_build{})
            .find("not authenticated") != std::string::npos);
  CHECK(c.other.ask<node_parts>(c.worker_at_other, build_atom::value, node_build{})
            .find("not from the chief") != std::string::npos);
  CHECK_FALSE(c.worker.next_event(std::chrono::milliseconds(300)));
}

TEST_CASE("control 'joined': to the chief from a task that made the handshake only") {
  cluster c;
  CHECK(c.stranger.tell_anonymously(c.chief_at_stranger, joined_atom::value,
                                    caf::actor_cast<caf::actor>(c.stranger.node), node_parts{}));
  c.stranger.tell(c.chief_at_stranger, joined_atom::value,
                  caf::actor_cast<caf::actor>(c.stranger.node), node_parts{});
  CHECK(logged("chief:0: refused 'joined' from a connection as worker:2"));
  CHECK_FALSE(c.chief.next_event(std::chrono::milliseconds(300)));
  // (worker:0's own join is the cluster's set-up.)
}

TEST_CASE("control 'ringnode': from a task that made the handshake only") {
  cluster c;
  CHECK(c.stranger.ask<ring_node_actor>(c.worker_at_stranger, ring_node_atom::value)
            .find("'ringnode' refused: not authenticated") != std::string::npos);
  CHECK(logged("worker:0: refused 'ringnode' from a connection as worker:2"));
  // A peer is answered (this worker has no ring node to give).
  CHECK(c.other.ask<ring_node_actor>(c.worker_at_other, ring_node_atom::value)
            .find("worker:0 has no ring node") != std::string::npos);
}

TEST_CASE("control 'hello': only as the task the connection authenticated as") {
  cluster c;
  // worker:2 knows the secret but passed the gate as worker:2: it cannot
  // make the node handshake as worker:0 (nor take worker:0's place).
  auto failure = node_handshake(c.stranger.sys, c.stranger.node, c.chief_at_stranger, "worker:0",
                                "chief:0", c.stranger.shared->handshake_key, true);
  CHECK(failure.find("chief:0 refused worker:0: it came over its connection as worker:2") !=
        std::string::npos);
  CHECK(logged("chief:0: refused a peer claiming to be worker:0"));
  CHECK(c.stranger.tell_anonymously(c.chief_at_stranger, challenge_atom::value,
                                    std::string("worker:0")));
  // As itself it may.
  CHECK(node_handshake(c.stranger.sys, c.stranger.node, c.chief_at_stranger, "worker:2", "chief:0",
                       c.stranger.shared->handshake_key, true)
            .empty());
}

// No silent hang: a running job that makes no update says so, naming the
// tasks it waits on (troupe node's chief watches its job this way, with
// kStallWarning).
TEST_CASE("a running job that makes no update is said at warning, naming its tasks") {
  std::atomic<int64_t> step{5};
  std::atomic<bool> training{true};
  stall_watch watch(
      "chief", "worker:0, worker:1", std::chrono::seconds(1), [&] { return step.load(); },
      [&] { return training.load(); });
  for (int i = 0; i < 20; ++i) {  // an update every 50 ms: nothing to say
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ++step;
  }
  CHECK(watch.warnings() == 0);
  CHECK(eventually([&] { return watch.warnings() >= 1; }, std::chrono::seconds(5)));
  CHECK(logged("chief: no update for "));
  CHECK(logged("(step 25); waiting on worker:0, worker:1"));
  // Out of training (an evaluation, the end): quiet.
  training = false;
  const auto said = watch.warnings();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(watch.warnings() == said);
}

// Behind the guard, the node actor itself refuses a message without a
// sender: what an anon_send from a thread of its own process delivers.
TEST_CASE("control messages without a sender from this process are refused by the node actor") {
  host worker("worker:0");
  caf::anon_send(caf::actor_cast<caf::actor>(worker.node), stop_atom::value, std::string("x"),
                 std::string());
  CHECK(logged("worker:0: refused 'stop' from an anonymous sender"));
  caf::anon_send(caf::actor_cast<caf::actor>(worker.node), preempt_atom::value,
                 std::string("chosen by the attacker"));
  CHECK(logged("worker:0: refused 'preempt' from an anonymous sender"));
  CHECK_FALSE(worker.next_event(std::chrono::milliseconds(300)));
}

// The coordinator's lifecycle messages: an anonymous one (a BASP message with
// source actor 0 addressed to its actor id looks the same to it as this)
// is refused and logged; from this process, taken.
TEST_CASE("coordinator: run, preempt and rejoin from its own process only") {
  troupe::test::strategy_env env(200);
  auto c = env.job("mirrored", "sgd", 2, 20);
  net_system_config cfg;
  caf::actor_system sys{cfg};
  auto plan = make_plan(c, {});
  auto coord =
      sys.spawn(coordinator, std::shared_ptr<const job_plan>(plan), std::make_shared<job_parts>());
  caf::anon_send(coord, preempt_atom::value, std::string("chosen by the attacker"));
  CHECK(logged("coordinator: refused 'preempt' from an anonymous sender"));
  caf::anon_send(coord, rejoin_atom::value, int64_t{0}, caf::actor{});
  CHECK(logged("coordinator: refused 'rejoin' from an anonymous sender"));
  caf::anon_send(coord, run_atom::value);
  CHECK(logged("coordinator: refused 'run' from an anonymous sender"));
  CHECK_FALSE(logs.contains("chosen by the attacker: the job stops"));
  send_from_here(sys, coord, preempt_atom::value, std::string("SIGTERM"));
  CHECK(logged("SIGTERM: the job stops at the next update with a checkpoint"));
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
}
