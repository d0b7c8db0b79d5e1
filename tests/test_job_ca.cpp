// The job CA (net/job_ca.hpp): what it issues and refuses, and links
// that authenticate with its certificates on 127.0.0.1. The rendezvous that
// issues them (one per live rank, a fresh one for a restart) is tested in
// test_cluster_env.cpp; a job from the environment under them, attacked by a
// holder of the secret, in test_nodes.cpp.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "net/chief_enrol.hpp"
#include "net/gate.hpp"
#include "net/job_ca.hpp"
#include "net/launch_enrol.hpp"
#include "net/rendezvous.hpp"
#include "net/socket.hpp"
#include "tests/attack.hpp"
#include "tests/captured_log.hpp"
#include "tests/fuzz/mutate.hpp"
#include "tests/gate_fixtures.hpp"

using namespace troupe;

namespace {

constexpr const char* kSecret = "5b0e2f9c1d7a44e38c6f0a9b2e17d4c3a8f5e6b7c9d0a1b2c3d4e5f60718293a";

const auto default_logger = spdlog::default_logger();  // (see test_cluster_env.cpp)

// `task`'s identity from `ca`, as the rendezvous issues it: a key made by the
// task, a request signed with it.
task_identity issued_by(const job_authority& ca, const std::string& task) {
  const task_key key;
  const std::string request = "request of " + task;
  return {task, ca.ca_pem(), ca.issue(task, key.public_raw(), request, key.sign_request(request)),
          key.private_pem()};
}

std::string issue_error(const job_authority& ca, const std::string& task, std::string_view key,
                        std::string_view request, std::string_view signature) {
  try {
    ca.issue(task, key, request, signature);
  } catch (const job_ca_error& e) {
    return e.what();
  }
  return "(issued)";
}

// What arrives on an admitted connection's plain end until it closes (or
// 10 s): "hello" from a connector whose link came up, "" from one refused.
std::string received(int fd) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buf[64];
  while (std::chrono::steady_clock::now() < until && out.size() < 5) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const auto n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// A listener as `task` whose links present `id`; keeps each admitted
// connection's plain end.
struct cert_listener {
  std::mutex mu;
  std::vector<int> fds;
  std::unique_ptr<gate> door;
  explicit cert_listener(const task_identity& id,
                         std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5)) {
    gate_options o;
    o.secret = kSecret;
    o.name = id.task;
    o.handshake_timeout = handshake_timeout;
    o.link.kind = link_security::trust::certificates;
    o.link.identity = std::make_shared<const task_identity>(id);
    door = std::make_unique<gate>("127.0.0.1", 0, o,
                                  [this](int fd, const std::string&, const std::string&) {
                                    std::lock_guard<std::mutex> g(mu);
                                    fds.push_back(fd);
                                  });
  }
  ~cert_listener() {
    door.reset();
    for (int fd : fds) ::close(fd);
  }
  std::size_t admitted() {
    std::lock_guard<std::mutex> g(mu);
    return fds.size();
  }
  // What the last admitted connection carried.
  std::string last_received() {
    int fd = -1;
    {
      std::lock_guard<std::mutex> g(mu);
      if (!fds.empty()) fd = fds.back();
    }
    return fd < 0 ? "(none admitted)" : received(fd);
  }
};

// Whether `log` holds `text` within 5 s (a gate logs on its own thread).
bool logs_soon(test::captured_log& log, const std::string& text) {
  return attack::eventually([&] { return log.text().find(text) != std::string::npos; },
                            std::chrono::seconds(5));
}

// Connects to `port` as `as`, its link presenting `id` (null: the link keyed
// from the secret alone), and says hello; the connector's error, or "".
std::string connect_as(uint16_t port, const std::string& as, const task_identity* id) {
  auto s = troupe::test::handshake_with_chief(port, kSecret, as, id);
  if (s.fd < 0) return s.error.empty() ? "(failed)" : s.error;
  (void)net::send_all(s.fd, "hello", std::chrono::steady_clock::now() + std::chrono::seconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::close(s.fd);
  return "";
}

}  // namespace

TEST_CASE("the job CA issues a certificate naming the task, for the requester's own key only") {
  const job_authority ca, rogue;
  const auto w0 = issued_by(ca, "worker:0");
  CHECK(check_task_identity(w0) == "");
  CHECK(w0.ca_pem == ca.ca_pem());
  CHECK(w0.ca_pem != rogue.ca_pem());
  // Two CAs, two keys: nothing of one job is valid in another.
  CHECK(check_task_identity({"worker:0", rogue.ca_pem(), w0.cert_pem, w0.key_pem}) ==
        "the certificate is not signed by the job CA");
  const auto w1 = issued_by(ca, "worker:1");
  CHECK(check_task_identity({"worker:0", w0.ca_pem, w0.cert_pem, w1.key_pem}) ==
        "the certificate is not for this task's key");
  CHECK(check_task_identity({"worker:1", w0.ca_pem, w0.cert_pem, w0.key_pem}) ==
        "the certificate does not name worker:1");
  CHECK(check_task_identity({"worker:0", w0.ca_pem, "junk", w0.key_pem}) ==
        "the certificate is not a PEM certificate");
  // The chief's own.
  const auto chief = ca.issue_self("chief:0");
  CHECK(chief.task == "chief:0");
  CHECK(check_task_identity(chief) == "");

  // A request is issued only with the signature of the key it carries.
  const task_key key, other;
  const std::string request = "rank 1's request";
  const auto sig = key.sign_request(request);
  CHECK(sig.size() == task_key::kSignatureBytes);
  CHECK(issue_error(ca, "worker:0", key.public_raw(), request, sig) == "(issued)");
  CHECK(issue_error(ca, "worker:0", other.public_raw(), request, sig) ==
        "its certificate request is not signed by the key it carries");
  CHECK(issue_error(ca, "worker:0", key.public_raw(), "another request", sig) ==
        "its certificate request is not signed by the key it carries");
  CHECK(issue_error(ca, "worker:0", key.public_raw(), request, sig.substr(1)) ==
        "a certificate request needs a 32-byte key and a 64-byte signature");
  CHECK(issue_error(ca, "worker:0", std::string(32, '\0'), request, std::string(64, '\0')) ==
        "its certificate request carries no key");
}

TEST_CASE("links with the job CA's certificates: its tasks pass; the secret alone does not") {
  const job_authority ca, rogue;
  const auto chief_id = ca.issue_self("chief:0");
  cert_listener chief(chief_id);

  // worker:0 with the certificate the job CA issued it: its link is up.
  const auto w0 = issued_by(ca, "worker:0");
  CHECK(connect_as(chief.door->port(), "worker:0", &w0) == "");
  CHECK(chief.last_received() == "hello");

  // A holder of the secret alone, as worker:1: the gate asks for a
  // certificate, so a link keyed from the secret gets no verdict, and a
  // certificate for worker:1 from a CA of its own, or worker:0's, is
  // refused, all before any TLS state. (The forger trusts the job CA, whose
  // certificate is no secret, so that the chief, not the forger, refuses.)
  auto forged = issued_by(rogue, "worker:1");
  forged.ca_pem = ca.ca_pem();
  const auto other_task = issued_by(ca, "worker:0");
  const std::vector<std::pair<const task_identity*, std::vector<std::string>>> attempts{
      {nullptr,
       {"claiming to be worker:1 (127.0.0.1:",
        "proved the key but sent no certificate within 1000 ms"}},
      {&forged, {"its certificate: unable to get local issuer certificate"}},
      {&other_task, {"its certificate does not name the task worker:1"}}};
  for (const auto& [id, logged] : attempts) {
    test::captured_log log;
    cert_listener door(chief_id, std::chrono::milliseconds(1000));
    CHECK(connect_as(door.door->port(), "worker:1", id) != "");
    CHECK(door.last_received() == "(none admitted)");
    for (const auto& text : logged) CHECK_MESSAGE(logs_soon(log, text), log.text());
  }
  // The listener's certificate is checked by the connector too: a listener
  // with another CA's chief:0 certificate is refused.
  cert_listener impostor(rogue.issue_self("chief:0"));
  CHECK(connect_as(impostor.door->port(), "worker:0", &w0) != "");
}

// Past the gate TLS checks the certificate again (defence in depth): a
// connector that proves worker:1 at the gate with its own certificate, then
// presents another CA's in TLS, gets no link.
TEST_CASE("job CA links: a certificate swapped after the gate fails TLS") {
  test::captured_log log;
  const job_authority ca, rogue;
  cert_listener chief(ca.issue_self("chief:0"));
  gate_options o;
  o.secret = kSecret;
  o.name = "worker:1";
  o.expect_peer = "chief:0";
  o.link.kind = link_security::trust::certificates;
  o.link.identity = std::make_shared<const task_identity>(issued_by(ca, "worker:1"));
  const auto keyed = with_link_key(o);
  auto s = gate_handshake("127.0.0.1", chief.door->port(), keyed, std::chrono::seconds(5));
  REQUIRE_MESSAGE(s.fd >= 0, s.error);
  auto swapped = issued_by(rogue, "worker:1");
  swapped.ca_pem = ca.ca_pem();
  auto tls = keyed.link;
  tls.identity = std::make_shared<const task_identity>(swapped);
  link_params lp;
  lp.me = "worker:1";
  lp.peer_task = s.peer;
  lp.peer_address = "chief";
  lp.server_challenge = s.server_challenge;
  lp.client_challenge = s.client_challenge;
  // TLS 1.3's client finishes before the server has checked its
  // certificate, so the refusal shows at the chief: nothing arrives there.
  auto end = open_link(s.fd, tls, lp);
  REQUIRE(end.ready.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  (void)net::send_all(end.plain_fd, "hello",
                      std::chrono::steady_clock::now() + std::chrono::seconds(5));
  // The gate hands the socket over after its verdict, on its own thread.
  REQUIRE(attack::eventually([&] { return chief.admitted() == 1; }));
  CHECK(chief.last_received() == "");
  ::close(end.plain_fd);
  CHECK_MESSAGE(logs_soon(log, "certificate: unable to get local issuer certificate"), log.text());
}

// troupe launch's enrolment (net/launch_enrol.hpp): the launcher's side
// answering over a socket pair as cli/supervise.cpp does.
namespace {

struct enrol_pair {
  int launcher = -1, task = -1;
  enrol_pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0);
    launcher = fds[0];
    task = fds[1];
  }
  ~enrol_pair() { ::close(launcher); }  // the task's end: launch_enrol::enrol closes it
  // The launcher answers the first request as the start of `started_as`.
  std::thread answer_as(const job_authority& ca, std::string started_as, std::string& refusal) {
    return std::thread([this, &ca, started_as, &refusal] {
      std::string request(launch_enrol::kFrameBytes + 1, '\0');
      auto n = ::recv(launcher, request.data(), request.size(), 0);
      request.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      const auto reply = launch_enrol::answer(ca, started_as, request, refusal);
      (void)::send(launcher, reply.data(), reply.size(), MSG_NOSIGNAL);
    });
  }
};

std::string enrol_error(int fd, const std::string& task) {
  try {
    launch_enrol::enrol(fd, task, std::chrono::seconds(30));
  } catch (const job_ca_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("troupe launch's enrolment issues the started task its certificate for its own key") {
  const job_authority ca;
  enrol_pair pair;
  std::string refusal;
  auto launcher = pair.answer_as(ca, "worker:1", refusal);
  const auto id = launch_enrol::enrol(pair.task, "worker:1", std::chrono::seconds(30));
  launcher.join();
  CHECK(refusal.empty());
  CHECK(id.task == "worker:1");
  CHECK(id.ca_pem == ca.ca_pem());
  CHECK(check_task_identity(id).empty());
}

TEST_CASE("troupe launch's enrolment refuses a request naming another task than the one started") {
  const job_authority ca;
  enrol_pair pair;
  std::string refusal;
  auto launcher = pair.answer_as(ca, "worker:1", refusal);
  const auto why = enrol_error(pair.task, "chief:0");
  launcher.join();
  CHECK(refusal == "it asks for a certificate as 'chief:0', but was started as worker:1");
  CHECK(why ==
        "TROUPE_ENROL_FD: the launcher refused the certificate request: it asks for a "
        "certificate as 'chief:0', but was started as worker:1");
}

TEST_CASE("troupe launch's enrolment refuses a request not signed by the key it carries") {
  const job_authority ca;
  const task_key key, other;
  const auto request = launch_enrol::make_request("worker:0", key.public_raw());
  std::string refusal;
  const auto reply =
      launch_enrol::answer(ca, "worker:0", request + other.sign_request(request), refusal);
  CHECK(refusal == "its certificate request is not signed by the key it carries");
  CHECK(reply.find("\"error\"") != std::string::npos);
  CHECK(reply.find("CERTIFICATE") == std::string::npos);
  launch_enrol::answer(ca, "worker:0", "troupeL1 and too short", refusal);
  CHECK(refusal == "not an enrolment request (22 bytes)");
}

TEST_CASE("TROUPE_ENROL_FD that is no launcher's socket is refused, naming the variable") {
  auto fd_error = [](const char* text) {
    try {
      launch_enrol::fd_of_variable(text);
    } catch (const job_ca_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(fd_error("x7") ==
        "TROUPE_ENROL_FD: expected the number of the socket troupe launch passed, got 'x7' (not "
        "a file descriptor number)");
  CHECK(fd_error("") ==
        "TROUPE_ENROL_FD: expected the number of the socket troupe launch passed, got '' (not a "
        "file descriptor number)");
  CHECK(fd_error("987654") ==
        "TROUPE_ENROL_FD: expected the number of the socket troupe launch passed, got '987654' "
        "(Bad file descriptor)");
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  CHECK(fd_error(std::to_string(pipe_fds[0]).c_str()) ==
        "TROUPE_ENROL_FD: expected the number of the socket troupe launch passed, got '" +
            std::to_string(pipe_fds[0]) + "' (not the launcher's socket)");
  for (int fd : pipe_fds) ::close(fd);
  enrol_pair pair;
  CHECK(launch_enrol::fd_of_variable(std::to_string(pair.task).c_str()) == pair.task);
  ::close(pair.task);
}

// The chief's enrolment desk (net/chief_enrol.hpp) behind a gate's side
// door, as a chief started by hand serves the tasks started by hand.
namespace {

struct enrol_desk_fixture {
  std::set<std::string> live;  // tasks with a link to the chief (is_live)
  std::mutex live_mutex;
  chief_enrol::desk desk{"chief:0", [this](const std::string& t) {
                           std::lock_guard<std::mutex> g(live_mutex);
                           return live.count(t) > 0;
                         }};
  std::unique_ptr<gate> door;
  enrol_desk_fixture() {
    gate_options o;
    o.secret = kSecret;
    o.name = "chief:0";
    o.allowed_peers = {"chief:0", "worker:0", "worker:1"};
    o.side_door = chief_enrol::door_of("chief:0");
    o.on_side_door = [this](int fd, const std::string& task, const std::string& peer) {
      desk.add(fd, task, peer);
    };
    // The node's own connections are not this test's: a handler takes them.
    door = std::make_unique<gate>(
        "127.0.0.1", 0, o, [](int fd, const std::string&, const std::string&) { ::close(fd); });
  }
  chief_enrol::enrolment enrol(const std::string& task, double seconds = 10,
                               const std::string& secret = kSecret) {
    return chief_enrol::enrol(secret, task, "chief:0", "127.0.0.1", door->port(),
                              std::chrono::steady_clock::now() +
                                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(seconds)));
  }
  std::string enrol_error(const std::string& task, double seconds = 1.5,
                          const std::string& secret = kSecret) {
    try {
      ::close(enrol(task, seconds, secret).held_fd);
    } catch (const job_ca_error& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST_CASE("a task started by hand enrols with the chief: a certificate for its own key, its name") {
  test::captured_log log;
  enrol_desk_fixture chief;
  auto w0 = chief.enrol("worker:0");
  CHECK(w0.held_fd >= 0);
  CHECK(w0.identity.task == "worker:0");
  CHECK(check_task_identity(w0.identity) == "");
  // Its certificate is from the chief's job CA: a link to a listener with the
  // chief's own certificate comes up with it.
  cert_listener node(chief.desk.issue_self());
  CHECK(connect_as(node.door->port(), "worker:0", &w0.identity) == "");
  CHECK(node.last_received() == "hello");
  ::close(w0.held_fd);
  CHECK(chief.desk.stats().issued == 1);
  CHECK(log.text().find("chief:0: enrolment: issued worker:0") != std::string::npos);
}

TEST_CASE("the chief's enrolment: a live task's name is not issued again; a restart's is") {
  test::captured_log log;
  enrol_desk_fixture chief;
  auto first = chief.enrol("worker:0");
  // While its enrolment connection is open, a second claimant (a holder of
  // the secret) is refused, told why, and the refusal is logged naming it.
  auto why = chief.enrol_error("worker:0");
  CHECK_MESSAGE(why.find("worker:0 is live") != std::string::npos, why << log.text());
  CHECK(log.text().find("refused a certificate for worker:0") != std::string::npos);
  // Once its link to the chief holds the name, the same.
  {
    std::lock_guard<std::mutex> g(chief.live_mutex);
    chief.live.insert("worker:0");
  }
  ::close(first.held_fd);
  why = chief.enrol_error("worker:0");
  CHECK_MESSAGE(why.find("worker:0") != std::string::npos, why);
  // The chief's own name is never issued.
  why = chief.enrol_error("chief:0");
  CHECK_MESSAGE(why.find("the chief's own name is never issued") != std::string::npos, why);
  // The process gone (its link closed too): a restart gets a new certificate
  // for its new key.
  {
    std::lock_guard<std::mutex> g(chief.live_mutex);
    chief.live.clear();
  }
  auto again = chief.enrol("worker:0");
  CHECK(check_task_identity(again.identity) == "");
  CHECK(again.identity.cert_pem != first.identity.cert_pem);
  CHECK(again.identity.key_pem != first.identity.key_pem);
  ::close(again.held_fd);
  CHECK(chief.desk.stats().issued == 2);
  CHECK(chief.desk.stats().refused >= 3);
}

TEST_CASE("the chief's enrolment: a wrong secret and a request for another task get nothing") {
  test::captured_log log;
  enrol_desk_fixture chief;
  const std::string other = "9f1c2e3d4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
  auto why = chief.enrol_error("worker:1", 1.5, other);
  CHECK_MESSAGE(why.find("wrong or missing cluster secret") != std::string::npos, why);
  // Past the door as worker:0, a request naming worker:1 is refused.
  gate_options o;
  o.secret = kSecret;
  o.name = "worker:0";
  o.expect_peer = chief_enrol::door_of("chief:0");
  auto s = gate_secure_handshake("127.0.0.1", chief.door->port(), o, std::chrono::seconds(5));
  REQUIRE_MESSAGE(s.fd >= 0, s.error);
  const task_key key;
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  REQUIRE(net::send_all(s.fd, launch_enrol::make_frame("worker:1", key), by));
  std::string header(rendezvous_wire::kReplyHeaderBytes, '\0'), err;
  REQUIRE_MESSAGE(net::recv_exact(s.fd, header, by, &err), err);
  std::string payload(static_cast<std::size_t>(rendezvous_wire::reply_length(header)), '\0');
  REQUIRE_MESSAGE(net::recv_exact(s.fd, payload, by, &err), err);
  ::close(s.fd);
  CHECK_MESSAGE(payload.find("as 'worker:1'") != std::string::npos, payload);
  CHECK(chief.desk.stats().issued == 0);
  CHECK(chief.desk.stats().refused == 1);
}

TEST_CASE("mutated enrolment frames: refused or issued for the signer, never trusted past checks") {
  const job_authority ca;
  const task_key key;
  const auto request = launch_enrol::make_frame("worker:0", key);
  std::string refusal;
  const auto reply = launch_enrol::answer(ca, "worker:0", request, refusal);
  REQUIRE(refusal.empty());
  const auto payload = reply.substr(rendezvous_wire::kReplyHeaderBytes);
  fuzz::mutator mutate(40);
  int issued = 0, read = 0;
  for (int i = 0; i < 3000; ++i) {
    // The desk's side: a mutant is issued a certificate only while it is the
    // request its key signed, for worker:0 (the name proved at the gate).
    // (The desk reads exactly a request's bytes off the stream.)
    auto r = mutate(request);
    r.resize(launch_enrol::kFrameBytes, '\0');
    const auto answered = launch_enrol::answer(ca, "worker:0", r, refusal);
    CHECK(rendezvous_wire::reply_length(answered.substr(0, rendezvous_wire::kReplyHeaderBytes)) >=
          0);
    if (refusal.empty()) {
      ++issued;
      CHECK(r == request);
    }
    // The task's side: an answer is taken only when its certificate names
    // worker:0, carries this task's key and is signed by the CA it carries.
    std::string problem;
    const auto id = launch_enrol::identity_of_reply(mutate(payload), "worker:0", key, problem);
    if (problem.empty()) {
      ++read;
      CHECK(check_task_identity(id) == "");
    }
  }
  CHECK(issued > 0);  // mutants that only touched bytes past the request
  MESSAGE("mutated enrolment frames: " << issued << " issued, " << read << " answers read");
}
