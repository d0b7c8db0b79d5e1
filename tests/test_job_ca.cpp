// The job CA (runtime/job_ca.hpp): what it issues and refuses, and links
// that authenticate with its certificates on 127.0.0.1. The rendezvous that
// issues them (one per live rank, a fresh one for a restart) is tested in
// test_cluster_env.cpp; a job from the environment under them, attacked by a
// holder of the secret, in test_nodes.cpp.
#include <doctest/doctest.h>
#include <poll.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/gate.hpp"
#include "runtime/job_ca.hpp"
#include "tests/captured_log.hpp"

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
  cert_listener(const task_identity& id) {
    gate_options o;
    o.secret = kSecret;
    o.name = id.task;
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

// Connects to `port` as `as`, its link presenting `id` (null: the link keyed
// from the secret alone), and says hello; the connector's error, or "".
std::string connect_as(uint16_t port, const std::string& as, const task_identity* id) {
  gate_options o;
  o.secret = kSecret;
  o.name = as;
  o.expect_peer = "chief:0";
  if (id) {
    o.link.kind = link_security::trust::certificates;
    o.link.identity = std::make_shared<const task_identity>(*id);
  }
  auto s = gate_secure_handshake("127.0.0.1", port, o, std::chrono::seconds(5));
  if (s.fd < 0) return s.error.empty() ? "(failed)" : s.error;
  (void)socket_io::send_all(s.fd, "hello",
                            std::chrono::steady_clock::now() + std::chrono::seconds(5));
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
  test::captured_log log;
  const job_authority ca, rogue;
  cert_listener chief(ca.issue_self("chief:0"));
  const auto port = chief.door->port();

  // worker:0 with the certificate the job CA issued it: its link is up.
  const auto w0 = issued_by(ca, "worker:0");
  CHECK(connect_as(port, "worker:0", &w0) == "");
  CHECK(chief.last_received() == "hello");

  // A holder of the secret alone, as worker:1 (the gate admits it): its
  // link keyed from the secret is refused, and so is a certificate for
  // worker:1 from a CA of its own, and worker:0's certificate as worker:1.
  // (The forger trusts the job CA, whose certificate is no secret, so that
  // the chief, not the forger, is the one to refuse.)
  auto forged = issued_by(rogue, "worker:1");
  forged.ca_pem = ca.ca_pem();
  const auto other_task = issued_by(ca, "worker:0");
  for (const task_identity* id : std::vector<const task_identity*>{nullptr, &forged, &other_task}) {
    connect_as(port, "worker:1", id);
    CHECK(chief.last_received() == "");
  }
  const auto text = log.text();
  CHECK_MESSAGE(text.find("chief:0: closed the connection with worker:1") != std::string::npos,
                text);
  CHECK(text.find("certificate: unable to get local issuer certificate") != std::string::npos);
  CHECK(text.find("its certificate does not name the task worker:1") != std::string::npos);
  // The listener's certificate is checked by the connector too: a listener
  // with another CA's chief:0 certificate is refused.
  cert_listener impostor(rogue.issue_self("chief:0"));
  CHECK(connect_as(impostor.door->port(), "worker:0", &w0) != "");
}
