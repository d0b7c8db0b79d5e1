// The gate in front of BASP (runtime/gate.hpp): who gets in, what an
// attacker gets, and that attacks cost the listener bounded memory.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "actors/net_system_config.hpp"
#include "config/secret.hpp"
#include "runtime/gate.hpp"
#include "tests/attack.hpp"

using namespace troupe;
using namespace troupe::attack;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr const char* kSecret = "gate-test-secret-0123456789abcdef";

gate_options opts(const std::string& name, const std::string& secret = kSecret) {
  gate_options o;
  o.secret = secret;
  o.name = name;
  return o;
}

// The listener: an actor that doubles ints, behind a gate on a free port.
struct listener {
  net_system_config cfg;
  caf::actor_system sys{cfg};
  // (Spawned with an argument: CAF 0.17 dereferences a null argument tuple
  // for a functor without arguments, which UBSan reports.)
  caf::actor doubler = sys.spawn(
      [](int factor) -> caf::behavior { return {[factor](int x) { return factor * x; }}; }, 2);
  std::unique_ptr<gate> door;
  explicit listener(gate_options o = opts("chief:0")) {
    door = open_gate(sys, doubler, "127.0.0.1", 0, std::move(o));
  }
  ~listener() {
    door.reset();
    caf::anon_send_exit(doubler, caf::exit_reason::user_shutdown);
  }
};

// A client process's side: its own actor system.
struct connector {
  net_system_config cfg;
  caf::actor_system sys{cfg};
  caf::expected<caf::actor> connect(uint16_t port, const gate_options& o) {
    return gate_remote_actor<caf::actor>(sys, "127.0.0.1", port, o, std::chrono::seconds(5));
  }
  // Asks `a` to double 21; the answer, or -1.
  int ask(const caf::actor& a) {
    caf::scoped_actor self{sys};
    int out = -1;
    self->request(a, std::chrono::seconds(5), 21)
        .receive([&](int r) { out = r; }, [&](caf::error&) {});
    return out;
  }
};

}  // namespace

TEST_CASE("a peer with the secret gets through the gate and talks BASP") {
  listener l;
  connector c;
  auto a = c.connect(l.door->port(), opts("worker:0"));
  REQUIRE_MESSAGE(a, c.sys.render(a.error()));
  CHECK(c.ask(*a) == 42);
  CHECK(l.door->stats().admitted == 1);
  CHECK(l.door->stats().refused == 0);
  // A second process, too.
  connector c2;
  auto b = c2.connect(l.door->port(), opts("worker:1"));
  REQUIRE(b);
  CHECK(c2.ask(*b) == 42);
  CHECK(l.door->stats().admitted == 2);
}

TEST_CASE("a wrong secret is refused on both sides, with the reason") {
  listener l;
  connector c;
  auto a = c.connect(l.door->port(), opts("worker:0", "another-secret-0123456789abcdef"));
  REQUIRE_FALSE(a);
  auto why = c.sys.render(a.error());
  CHECK_MESSAGE(why.find("wrong or missing cluster secret") != std::string::npos, why);
  CHECK(eventually([&] { return l.door->stats().refused == 1; }));
  CHECK(l.door->stats().admitted == 0);

  // A listener that admits anyone but cannot prove the secret: the
  // connector does not trust it, and BASP never starts.
  int srv = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(srv, 4) == 0);
  REQUIRE(::getsockname(srv, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  std::string saw;
  std::thread impostor([&] {
    int fd = ::accept(srv, nullptr, nullptr);
    std::string hello = std::string(gate_wire::kMagic) + make_challenge();
    (void)::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    std::string proof(gate_wire::kProofBytes, '\0');
    (void)::recv(fd, proof.data(), proof.size(), MSG_WAITALL);
    std::string verdict = std::string(gate_wire::kMagic) + "A" + "chief:0" +
                          std::string(gate_wire::kNameBytes - 7, '\0') + std::string(64, 'a');
    (void)::send(fd, verdict.data(), verdict.size(), MSG_NOSIGNAL);
    saw = drain(fd, std::chrono::seconds(2));
    ::close(fd);
  });
  auto b = c.connect(ntohs(addr.sin_port), opts("worker:0"));
  impostor.join();
  ::close(srv);
  REQUIRE_FALSE(b);
  why = c.sys.render(b.error());
  CHECK_MESSAGE(why.find("did not prove it knows the cluster secret") != std::string::npos, why);
  CHECK(saw.empty());  // no BASP handshake followed
}

TEST_CASE("a plain CAF client never reaches BASP") {
  listener l;
  connector c;
  auto h = c.sys.middleman().remote_actor<caf::actor>("127.0.0.1", l.door->port());
  CHECK_FALSE(h);
  CHECK(eventually([&] { return l.door->stats().refused == 1; }));
  CHECK(l.door->stats().admitted == 0);
}

TEST_CASE("a forged BASP handshake with the select-connection flag gets nothing") {
  listener l;
  connector good;
  auto a = good.connect(l.door->port(), opts("worker:0"));
  REQUIRE(a);
  auto got = forged_handshake(l.door->port());
  // Only the gate's hello (a magic and a random challenge), then the close.
  CHECK(got.size() == gate_wire::kHelloBytes);
  CHECK(got.compare(0, gate_wire::kMagicBytes, gate_wire::kMagic) == 0);
  CHECK(eventually([&] { return l.door->stats().refused == 1; }));
  // The real peer still talks.
  CHECK(good.ask(*a) == 42);
}

TEST_CASE("oversized headers and random bytes cost bounded memory, and peers still join") {
  auto o = opts("chief:0");
  o.handshake_timeout = std::chrono::seconds(1);
  listener l(o);
  auto before = rss_mb();
  auto fds = flood(l.door->port(), 4, 300);
  // A real peer joins in the middle of it.
  connector c;
  auto a = c.connect(l.door->port(), opts("worker:0"));
  REQUIRE_MESSAGE(a, c.sys.render(a.error()));
  CHECK(c.ask(*a) == 42);
  CHECK(eventually([&] {
    auto s = l.door->stats();
    return s.refused + s.evicted + s.timed_out >= 304;
  }));
  auto grown = rss_mb() - before;
  CHECK_MESSAGE(grown < 100, "RSS grew by " << grown << " MB");
  for (int fd : fds) ::close(fd);
  CHECK(l.door->stats().admitted == 1);
}

TEST_CASE("idle and slow connections are closed at the handshake timeout") {
  auto o = opts("chief:0");
  o.handshake_timeout = std::chrono::milliseconds(300);
  o.max_pending = 8;
  listener l(o);
  int idle = raw_connect(l.door->port());
  int slow = raw_connect(l.door->port());
  // The slow one sends a valid proof's bytes, one every 50 ms: too late.
  std::thread dribble([&] {
    std::string hello(gate_wire::kHelloBytes, '\0');
    (void)::recv(slow, hello.data(), hello.size(), MSG_WAITALL);
    auto proof = gate_wire::make_proof(kSecret, "worker:0", hello.substr(gate_wire::kMagicBytes),
                                       make_challenge());
    for (char ch : proof) {
      if (::send(slow, &ch, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  CHECK(closed_within(idle, std::chrono::seconds(5)));
  CHECK(closed_within(slow, std::chrono::seconds(5)));
  dribble.join();
  ::close(idle);
  ::close(slow);
  CHECK(l.door->stats().timed_out == 2);
  CHECK(l.door->stats().admitted == 0);

  // More idle connections than max_pending: the oldest make room, so a real
  // peer still gets in while they are held open.
  std::vector<int> held;
  for (int i = 0; i < 20; ++i) held.push_back(raw_connect(l.door->port()));
  connector c;
  auto a = c.connect(l.door->port(), opts("worker:0"));
  REQUIRE_MESSAGE(a, c.sys.render(a.error()));
  CHECK(c.ask(*a) == 42);
  CHECK(l.door->stats().evicted >= 12);
  for (int fd : held) ::close(fd);
}

TEST_CASE("every corrupted byte of a proof is refused") {
  const std::string server_challenge = make_challenge();
  const std::string client_challenge = make_challenge();
  auto proof = gate_wire::make_proof(kSecret, "worker:3", server_challenge, client_challenge);
  REQUIRE(proof.size() == gate_wire::kProofBytes);
  auto ok = gate_wire::check_proof(kSecret, server_challenge, proof);
  CHECK(ok.problem.empty());
  CHECK(ok.name == "worker:3");
  CHECK(ok.client_challenge == client_challenge);
  // The same proof for another server challenge, with another secret, or
  // with any one byte changed (except the name field's padding) fails.
  CHECK_FALSE(gate_wire::check_proof(kSecret, make_challenge(), proof).problem.empty());
  CHECK_FALSE(gate_wire::check_proof("other-secret-0123456789abcdef", server_challenge, proof)
                  .problem.empty());
  std::mt19937 rng(11);
  for (std::size_t i = 0; i < proof.size(); ++i) {
    auto bad = proof;
    bad[i] = static_cast<char>(bad[i] ^ static_cast<char>(1 + rng() % 255));
    auto r = gate_wire::check_proof(kSecret, server_challenge, bad);
    CHECK_MESSAGE(!r.problem.empty(), "byte " << i << " changed and still admitted");
  }
  // The listener's verdict, likewise, on the connector's side.
  auto verdict =
      gate_wire::make_verdict(true, kSecret, "chief:0", server_challenge, client_challenge);
  REQUIRE(verdict.size() == gate_wire::kVerdictBytes);
  auto trusted = gate_wire::check_verdict(kSecret, server_challenge, client_challenge, verdict);
  CHECK(trusted.problem.empty());
  CHECK(trusted.name == "chief:0");
  for (std::size_t i = 0; i < verdict.size(); ++i) {
    auto bad = verdict;
    bad[i] = static_cast<char>(bad[i] ^ static_cast<char>(1 + rng() % 255));
    CHECK_MESSAGE(
        !gate_wire::check_verdict(kSecret, server_challenge, client_challenge, bad).problem.empty(),
        "verdict byte " << i << " changed and still trusted");
  }
  CHECK(gate_wire::check_hello(gate_wire::make_hello(server_challenge)) == server_challenge);
  CHECK(gate_wire::check_hello(gate_wire::make_hello(server_challenge).substr(1)).empty());
  CHECK(gate_wire::check_hello(std::string(gate_wire::kMagic) + std::string(64, 'Z')).empty());
  // Truncated and extended frames.
  CHECK_FALSE(
      gate_wire::check_proof(kSecret, server_challenge, proof.substr(0, 199)).problem.empty());
  CHECK_FALSE(gate_wire::check_proof(kSecret, server_challenge, proof + "x").problem.empty());
}

TEST_CASE("a gate needs a usable address and name") {
  net_system_config cfg;
  caf::actor_system sys{cfg};
  auto a = sys.spawn(
      [](int factor) -> caf::behavior { return {[factor](int x) { return factor * x; }}; }, 1);
  CHECK_THROWS_WITH_AS(open_gate(sys, a, "203.0.113.1", 0, opts("chief:0")),
                       doctest::Contains("cannot listen on 203.0.113.1:0"), gate_error);
  CHECK_THROWS_AS(open_gate(sys, a, "127.0.0.1", 0, opts("")), gate_error);
  {
    auto first = open_gate(sys, a, "127.0.0.1", 0, opts("chief:0"));
    // The same port again is refused (SO_REUSEADDR does not share a live
    // listener).
    CHECK_THROWS_WITH_AS(open_gate(sys, a, "127.0.0.1", first->port(), opts("chief:0")),
                         doctest::Contains("Address already in use"), gate_error);
  }
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}
