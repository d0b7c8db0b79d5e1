// The cluster from the environment: the resolver on each flavour of
// variables (troupe's, torchrun/Kubeflow's, SLURM's) with its errors, SLURM's
// host lists, the rendezvous frames, and the rendezvous itself between
// threads on 127.0.0.1 (its refusals and its timeouts).
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <future>
#include <thread>

#include "actors/job_options.hpp"
#include "config/cluster_env.hpp"
#include "config/job_config.hpp"
#include "net/gate.hpp"
#include "net/rendezvous.hpp"
#include "net/socket.hpp"
#include "tests/captured_log.hpp"
#include "tests/free_port.hpp"
#include "tests/fuzz/mutate.hpp"

using namespace troupe;
using hosts = std::vector<std::string>;

// Every line logged, kept for the cases that wait on the chief's progress.
troupe::test::ring_log logs;  // (installed before any thread runs)

namespace {

constexpr const char* kSecret = "7834a8fdce0a3a0077c828817deb43cd1a958f30a0a43568bf0d69e58e998062";

// spdlog's registry is made on first use, inside libspdlog, which TSan does
// not see: made here, before the rendezvous threads log, it is not reported
// as a race between them.
const auto default_logger = spdlog::default_logger();

// The error resolve_cluster_env gives for `env`, or "(no error)".
std::string error_of(const environment_map& env, const cluster_spec& spec = {}) {
  try {
    resolve_cluster_env(env, spec, "this-host");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

std::string hostlist_error(const std::string& list) {
  try {
    expand_hostlist(list);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

const environment_map kTorch = {
    {"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "master-0"}, {"MASTER_PORT", "23456"}};

const environment_map kSlurm = {
    {"SLURM_PROCID", "3"},      {"SLURM_NTASKS", "4"},
    {"SLURM_LOCALID", "1"},     {"SLURM_JOB_NODELIST", "node[07-08,10]"},
    {"SLURM_JOB_ID", "123456"}, {"SLURMD_NODENAME", "node08"}};

environment_map with(environment_map env, const std::string& name, const std::string& value) {
  env[name] = value;
  return env;
}

environment_map without(environment_map env, const std::string& name) {
  env.erase(name);
  return env;
}

using troupe::test::free_port;

// Bytes read from `fd` until the peer closes it; -1 when it is still open
// after `limit`.
long bytes_until_closed(int fd, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  long total = 0;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    auto n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return total;
    total += n;
  }
  return -1;
}

cluster_env rank_env(int64_t rank, int64_t world, const std::string& chief) {
  cluster_env e;
  e.source = "TROUPE_RANK";
  e.rank = rank;
  e.world_size = world;
  e.chief = chief;
  e.task = role_of_rank(rank, 0);
  e.advertise_host = "127.0.0.1";
  return e;
}

// Whichever of two futures is ready first (the other may wait for long).
std::future<std::string>& first_ready(std::future<std::string>& a, std::future<std::string>& b) {
  for (;;) {
    if (a.wait_for(std::chrono::milliseconds(5)) == std::future_status::ready) return a;
    if (b.wait_for(std::chrono::milliseconds(5)) == std::future_status::ready) return b;
  }
}

std::string address(uint16_t port) {
  return "127.0.0.1:" + std::to_string(port);
}

// A connection to the chief's rendezvous that passed its gate as `name`,
// retried while the chief is not listening yet (10 s at most).
int admitted_as(const std::string& chief_addr, const std::string& name) {
  const auto chief = parse_host_port(chief_addr);
  gate_options o;
  o.secret = kSecret;
  o.name = name;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto s = gate_secure_handshake(chief.host, chief.port, o, std::chrono::seconds(2));
    if (s.fd >= 0) return s.fd;
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, s.error);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The chief's answer to an announce of `rank` sent on `fd` (10 s at most),
// as join_rendezvous reads it: the tasks, or the error.
std::string answer_to_announce(int fd, int64_t rank, int64_t world, const std::string& at) {
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  const auto r = request_reply(fd, rendezvous_wire::make_announce(rank, world, at), by);
  if (r.state == chief_reply::status::not_sent) return "(not sent)";
  if (r.state == chief_reply::status::no_answer) return "(no answer: " + r.why + ")";
  if (r.state == chief_reply::status::malformed) return "(a malformed answer)";
  try {
    return nlohmann::json(rendezvous_wire::tasks_of_reply(r.payload)).dump();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

// An announce of `rank` with a certificate request signed by `key`, as
// join_rendezvous sends it.
std::string signed_announce(int64_t rank, int64_t world, const std::string& at,
                            const task_key& key) {
  const auto request = rendezvous_wire::make_request(rank, world, at, key.public_raw());
  return rendezvous_wire::make_announce(rank, world, at, key.public_raw(),
                                        key.sign_request(request));
}

// Whether something listens at 127.0.0.1:port (binding it fails).
bool port_held(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool held =
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return held;
}

}  // namespace

TEST_CASE("SLURM host lists expand in order, zero padding kept") {
  CHECK(expand_hostlist("node01") == hosts{"node01"});
  CHECK(expand_hostlist("node[01-04,07]") ==
        hosts{"node01", "node02", "node03", "node04", "node07"});
  CHECK(expand_hostlist("a[1-2],b3") == hosts{"a1", "a2", "b3"});
  CHECK(expand_hostlist("n[8-11]") == hosts{"n8", "n9", "n10", "n11"});
  CHECK(expand_hostlist("n[098-101]") == hosts{"n098", "n099", "n100", "n101"});
  CHECK(expand_hostlist("x[1-2]-y[3-4]") == hosts{"x1-y3", "x1-y4", "x2-y3", "x2-y4"});
  CHECK(expand_hostlist("127.0.0.1") == hosts{"127.0.0.1"});
  CHECK(expand_hostlist("gpu[1],cpu[2-3],login") == hosts{"gpu1", "cpu2", "cpu3", "login"});

  CHECK(hostlist_error("") == "the host list is empty");
  CHECK(hostlist_error("node[01-04") == "an unclosed '[' in \"node[01-04\"");
  CHECK(hostlist_error("node]1") == "a ']' without its '[' in \"node]1\"");
  CHECK(hostlist_error("node[4-1]") == "the range \"4-1\" runs backwards in \"node[4-1]\"");
  CHECK(hostlist_error("node[a-b]") ==
        "expected a number or a range like 01-04, got \"a-b\" in \"node[a-b]\"");
  CHECK(hostlist_error("a,,b") == "an empty host name in \"a,,b\"");
  CHECK(hostlist_error("n[0-99999999]") ==
        "the range \"0-99999999\" names more than 65536 hosts in \"n[0-99999999]\"");
}

TEST_CASE("ranks map to roles: the chief, then cluster.roles.ps ps tasks, then workers") {
  CHECK(role_of_rank(0, 0) == task_id{"chief", 0});
  CHECK(role_of_rank(1, 0) == task_id{"worker", 0});
  CHECK(role_of_rank(3, 0) == task_id{"worker", 2});
  CHECK(role_of_rank(1, 2) == task_id{"ps", 0});
  CHECK(role_of_rank(2, 2) == task_id{"ps", 1});
  CHECK(role_of_rank(3, 2) == task_id{"worker", 0});
  auto tasks = tasks_of_ranks({"c:1", "p:2", "w:3", "w:4"}, 1);
  CHECK(tasks == std::map<std::string, hosts>{
                     {"chief", {"c:1"}}, {"ps", {"p:2"}}, {"worker", {"w:3", "w:4"}}});
}

TEST_CASE("troupe's own variables") {
  environment_map env = {{"TROUPE_RANK", "1"},
                         {"TROUPE_WORLD_SIZE", "3"},
                         {"TROUPE_CHIEF", "10.0.0.5:7000"},
                         {"TROUPE_ADVERTISE_ADDR", "10.0.0.6"},
                         {"TROUPE_PORT", "7100"}};
  auto e = resolve_cluster_env(env, {}, "this-host");
  CHECK(e.source == "TROUPE_RANK");
  CHECK(e.rank == 1);
  CHECK(e.world_size == 3);
  CHECK(e.chief == "10.0.0.5:7000");
  CHECK(e.task == task_id{"worker", 0});
  CHECK(e.advertise_host == "10.0.0.6");
  CHECK(e.listen_port == 7100);

  // They win over torchrun's and SLURM's.
  auto all = env;
  all.insert(kTorch.begin(), kTorch.end());
  all.insert(kSlurm.begin(), kSlurm.end());
  CHECK(resolve_cluster_env(all, {}, "h").rank == 1);

  // The chief listens at its own address.
  auto chief = resolve_cluster_env(with(env, "TROUPE_RANK", "0"), {}, "h");
  CHECK(chief.task == task_id{"chief", 0});
  CHECK(chief.advertise_host == "10.0.0.5");
  CHECK(chief.listen_port == 7000);

  CHECK(error_of(with(env, "TROUPE_RANK", "3")) ==
        "TROUPE_RANK: expected an integer in 0..TROUPE_WORLD_SIZE-1 (0..2), got \"3\"");
  CHECK(error_of(with(env, "TROUPE_RANK", "-1")) ==
        "TROUPE_RANK: expected an integer in 0..TROUPE_WORLD_SIZE-1 (0..2), got \"-1\"");
  CHECK(error_of(without(env, "TROUPE_RANK")) ==
        "TROUPE_RANK: not set; it says which rank this process is");
  CHECK(error_of(with(env, "TROUPE_WORLD_SIZE", "0")) ==
        "TROUPE_WORLD_SIZE: expected an integer in 1..65536, got \"0\"");
  CHECK(error_of(without(env, "TROUPE_CHIEF")) ==
        "TROUPE_CHIEF: not set; it gives the chief's address as host:port (rank 0's)");
  CHECK(error_of(with(env, "TROUPE_CHIEF", "10.0.0.5")) ==
        "TROUPE_CHIEF: expected \"host:port\", got \"10.0.0.5\"");
  CHECK(error_of(with(env, "TROUPE_PORT", "70000")) ==
        "TROUPE_PORT: expected an integer in 1..65535, got \"70000\"");
  CHECK(error_of(with(env, "TROUPE_ADVERTISE_ADDR", "a b")) ==
        "TROUPE_ADVERTISE_ADDR: expected a host name or an IP address, got \"a b\"; set "
        "TROUPE_ADVERTISE_ADDR to the address other ranks reach this one at");
}

TEST_CASE("torchrun's and Kubeflow PyTorchJob's variables") {
  auto e = resolve_cluster_env(kTorch, {}, "this-host");
  CHECK(e.source == "RANK");
  CHECK(e.rank == 2);
  CHECK(e.world_size == 4);
  CHECK(e.chief == "master-0:23456");
  CHECK(e.task == task_id{"worker", 1});
  CHECK(e.advertise_host == "this-host");  // the machine's name without TROUPE_ADVERTISE_ADDR
  CHECK(e.listen_port == 0);               // the OS picks one
  CHECK(resolve_cluster_env(with(kTorch, "LOCAL_RANK", "1"), {}, "h").local_rank == 1);
  CHECK(resolve_cluster_env(with(kTorch, "MASTER_ADDR", "fd00::1"), {}, "h").chief ==
        "[fd00::1]:23456");

  cluster_spec ps;
  ps.ps_ranks = 2;
  CHECK(resolve_cluster_env(kTorch, ps, "h").task == task_id{"ps", 1});
  ps.ps_ranks = 4;
  CHECK(error_of(kTorch, ps) ==
        "cluster.roles.ps: expected at most the 3 ranks after the chief (world size 4 from "
        "RANK's set), got 4");

  CHECK(error_of(with(kTorch, "RANK", "x")) ==
        "RANK: expected an integer in 0..WORLD_SIZE-1 (0..3), got \"x\"");
  CHECK(error_of(with(kTorch, "RANK", "4")) ==
        "RANK: expected an integer in 0..WORLD_SIZE-1 (0..3), got \"4\"");
  CHECK(error_of(with(kTorch, "WORLD_SIZE", "four")) ==
        "WORLD_SIZE: expected an integer in 1..65536, got \"four\"");
  CHECK(error_of(without(kTorch, "WORLD_SIZE")) ==
        "WORLD_SIZE: not set; it says how many ranks the job has");
  CHECK(error_of(without(kTorch, "MASTER_ADDR")) ==
        "MASTER_ADDR: not set; it names the chief's (rank 0's) host");
  CHECK(error_of(without(kTorch, "MASTER_PORT")) ==
        "MASTER_PORT: not set; it gives the chief's (rank 0's) port");
  CHECK(error_of(with(kTorch, "MASTER_PORT", "0")) ==
        "MASTER_PORT: expected an integer in 1..65535, got \"0\"");
  CHECK(error_of(with(kTorch, "MASTER_ADDR", "bad host")) ==
        "MASTER_ADDR: expected \"host:port\", got \"bad host:23456\"");
  CHECK(error_of(with(kTorch, "LOCAL_RANK", "-1")) ==
        "LOCAL_RANK: expected an integer 0 or more, got \"-1\"");
}

TEST_CASE("SLURM's variables: the chief on the first host, its port from the job id") {
  auto e = resolve_cluster_env(kSlurm, {}, "this-host");
  CHECK(e.source == "SLURM_PROCID");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.task == task_id{"worker", 2});
  CHECK(slurm_chief_port(123456) == 20000 + 123456 % 12000);
  CHECK(e.chief == "node07:" + std::to_string(slurm_chief_port(123456)));
  CHECK(e.advertise_host == "node08");  // SLURMD_NODENAME
  // The derived port stays unprivileged and below Linux's ephemeral ports.
  for (uint64_t id : {0ull, 1ull, 11999ull, 12000ull, 987654321ull}) {
    CHECK(slurm_chief_port(id) >= 20000);
    CHECK(slurm_chief_port(id) < 32768);
  }
  CHECK(slurm_chief_port(7) != slurm_chief_port(8));

  // A port given: TROUPE_CHIEF_PORT first, then cluster.port.
  cluster_spec spec;
  spec.port = 29400;
  CHECK(resolve_cluster_env(kSlurm, spec, "h").chief == "node07:29400");
  CHECK(resolve_cluster_env(with(kSlurm, "TROUPE_CHIEF_PORT", "29500"), spec, "h").chief ==
        "node07:29500");
  CHECK(resolve_cluster_env(without(kSlurm, "SLURM_JOB_ID"), spec, "h").chief == "node07:29400");
  CHECK(resolve_cluster_env(with(kSlurm, "SLURM_JOB_NODELIST", "127.0.0.1"), spec, "h").chief ==
        "127.0.0.1:29400");
  CHECK(resolve_cluster_env(with(kSlurm, "TROUPE_ADVERTISE_ADDR", "10.1.1.1"), {}, "h")
            .advertise_host == "10.1.1.1");

  CHECK(error_of(with(kSlurm, "SLURM_PROCID", "4")) ==
        "SLURM_PROCID: expected an integer in 0..SLURM_NTASKS-1 (0..3), got \"4\"");
  CHECK(error_of(without(kSlurm, "SLURM_NTASKS")) ==
        "SLURM_NTASKS: not set; it says how many tasks the job step has");
  CHECK(error_of(with(kSlurm, "SLURM_LOCALID", "one")) ==
        "SLURM_LOCALID: expected an integer 0 or more, got \"one\"");
  CHECK(error_of(without(kSlurm, "SLURM_JOB_NODELIST")) ==
        "SLURM_JOB_NODELIST: not set; the chief runs on the first host of the job's nodes");
  CHECK(error_of(with(kSlurm, "SLURM_JOB_NODELIST", "node[1-")) ==
        "SLURM_JOB_NODELIST: an unclosed '[' in \"node[1-\"");
  CHECK(error_of(without(kSlurm, "SLURM_JOB_ID")) ==
        "SLURM_JOB_ID: not set; the chief's port is derived from it when neither "
        "TROUPE_CHIEF_PORT nor cluster.port gives one");
  CHECK(error_of(with(kSlurm, "SLURM_JOB_ID", "12x")) ==
        "SLURM_JOB_ID: expected an integer, got \"12x\"");
  CHECK(error_of(with(kSlurm, "TROUPE_CHIEF_PORT", "http")) ==
        "TROUPE_CHIEF_PORT: expected an integer in 1..65535, got \"http\"");
}

TEST_CASE("no rank in the environment: an error naming every way to give one") {
  CHECK(!environment_has_cluster({{"HOME", "/root"}}));
  CHECK(environment_has_cluster(kTorch));
  CHECK(environment_has_cluster(kSlurm));
  CHECK(error_of({{"HOME", "/root"}}) ==
        "the config has no cluster.tasks and the environment names no rank: set TROUPE_RANK, "
        "TROUPE_WORLD_SIZE and TROUPE_CHIEF, or torchrun's RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT, or run under SLURM's srun (SLURM_PROCID), or give --task");
  // A partial set of troupe's own is reported as such, not skipped.
  CHECK(error_of(with(kTorch, "TROUPE_WORLD_SIZE", "4")) ==
        "TROUPE_RANK: not set; it says which rank this process is");
}

TEST_CASE("rendezvous frames: an announce round-trips; bad ones are refused, not trusted") {
  using namespace rendezvous_wire;
  auto frame = make_announce(2, 3, "127.0.0.1:7001");
  REQUIRE(frame.size() == kAnnounceBytes);
  auto ok = check_announce(frame, 3);
  CHECK(ok.problem == "");
  CHECK(ok.rank == 2);
  CHECK(ok.address == "127.0.0.1:7001");
  // The certificate request: the signed part, the key and its signature.
  task_key key;
  const auto signed_frame = signed_announce(2, 3, "127.0.0.1:7001", key);
  REQUIRE(signed_frame.size() == kAnnounceBytes);
  auto request = check_announce(signed_frame, 3);
  CHECK(request.problem == "");
  CHECK(request.public_key == key.public_raw());
  CHECK(request.request == make_request(2, 3, "127.0.0.1:7001", key.public_raw()));
  CHECK(request.signature.size() == kSignatureBytes);
  CHECK(request.request + request.signature == signed_frame);

  CHECK(check_announce(frame, 4).problem == "it announces a world size of 3, the chief's is 4");
  CHECK(check_announce(make_announce(3, 3, "h:1"), 3).problem ==
        "rank 3 is outside 1..2 (rank 0 is the chief)");
  CHECK(check_announce(make_announce(0, 3, "h:1"), 3).problem ==
        "rank 0 is outside 1..2 (rank 0 is the chief)");
  CHECK(check_announce(make_announce(-1, 3, "h:1"), 3)
            .problem.starts_with("rank 18446744073709551615"));
  CHECK(check_announce(make_announce(1, 3, "no-port"), 3).problem ==
        "its address: expected \"host:port\", got \"no-port\"");
  CHECK(check_announce(frame.substr(1), 3).problem == "not a rendezvous announce");
  auto junk_after = frame;
  junk_after[kMagicBytes + 16 + kAddressBytes - 1] = 'x';
  CHECK(check_announce(junk_after, 3).problem == "a malformed address field");
  auto bad_magic = frame;
  bad_magic[0] = 'X';
  CHECK(check_announce(bad_magic, 3).problem == "not a rendezvous announce");

  auto reply = make_reply({{"tasks", {{"chief", {"a:1"}}, {"worker", {"b:2", "c:3"}}}}});
  auto n = reply_length(reply.substr(0, kReplyHeaderBytes));
  REQUIRE(n == static_cast<int64_t>(reply.size() - kReplyHeaderBytes));
  CHECK(tasks_of_reply(reply.substr(kReplyHeaderBytes)) ==
        cluster_tasks{{"chief", {"a:1"}}, {"worker", {"b:2", "c:3"}}});
  auto huge = std::string(kMagic, kMagicBytes) + std::string("\xff\xff\xff\xff", 4);
  CHECK(reply_length(huge) == -1);
  CHECK(reply_length(std::string("troupeG1\0\0\0\1", 12)) == -1);  // another magic
  CHECK_THROWS_WITH_AS(tasks_of_reply(R"({"error": "rank 2 already joined"})"),
                       "the chief refused this rank: rank 2 already joined", std::invalid_argument);
  CHECK_THROWS_WITH_AS(tasks_of_reply("[1,2"), "the chief's answer is not a JSON object",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(tasks_of_reply(R"({"tasks": {"worker": [1]}})"),
                       "the chief's tasks.worker holds a non-string", std::invalid_argument);
  // The certificate in a reply: both parts, or nothing.
  auto issued = certificate_of_reply(R"({"tasks": {}, "certificate": "C", "ca": "A"})");
  CHECK(issued.certificate == "C");
  CHECK(issued.ca == "A");
  CHECK(certificate_of_reply(R"({"tasks": {}, "certificate": "C"})").certificate == "");
  CHECK(certificate_of_reply(R"({"certificate": 1, "ca": "A"})").ca == "");
  CHECK(certificate_of_reply("[").certificate == "");
}

TEST_CASE("mutated rendezvous frames: refused or read, never trusted past their checks") {
  using namespace rendezvous_wire;
  task_key key;
  const job_authority ca;
  const auto announce = signed_announce(2, 3, "127.0.0.1:7001", key);
  const auto reply = make_reply({{"tasks", {{"chief", {"a:1"}}, {"worker", {"b:2", "c:3"}}}},
                                 {"certificate", "C"},
                                 {"ca", "A"}});
  fuzz::mutator mutate(25);
  int accepted = 0, issued = 0;
  for (int i = 0; i < 3000; ++i) {
    auto a = mutate(announce);
    a.resize(kAnnounceBytes, '\0');
    auto check = check_announce(a, 3);
    if (check.problem.empty()) {
      ++accepted;
      CHECK((check.rank == 1 || check.rank == 2));
      CHECK_NOTHROW(parse_host_port(check.address));
      // The job CA issues a certificate for the requester's key only for
      // the request that key signed: a mutant that changed a signed byte or
      // the signature is refused. (One that replaced the key as well gets,
      // at most, a certificate for a key that is not the requester's.)
      try {
        ca.issue("worker:1", check.public_key, check.request, check.signature);
        if (check.public_key == key.public_raw()) {
          ++issued;
          CHECK(a == announce);
        }
      } catch (const job_ca_error&) {
      }
    }
    auto r = mutate(reply);
    CHECK(reply_length(r.substr(0, kReplyHeaderBytes)) <= static_cast<int64_t>(kMaxReplyBytes));
    const auto payload = r.size() > kReplyHeaderBytes ? r.substr(kReplyHeaderBytes) : r;
    const auto cert = certificate_of_reply(payload);
    CHECK(cert.certificate.empty() == cert.ca.empty());
    try {
      tasks_of_reply(payload);
    } catch (const std::invalid_argument&) {
    }
  }
  CHECK(accepted > 0);  // some mutants only touch padding or keep a valid frame
  CHECK(issued > 0);    // ... and those that kept it whole are still issued
}

TEST_CASE("the rendezvous between threads: ranks in any order get the same cluster") {
  const auto chief_addr = address(free_port());
  const auto a1 = address(free_port()), a2 = address(free_port());
  // The other ranks first: they retry until the chief listens.
  task_identity id0, id1, id2;
  auto r2 = std::async(std::launch::async, [&] {
    return join_rendezvous(kSecret, rank_env(2, 3, chief_addr), a2, std::chrono::seconds(20), &id2);
  });
  auto r1 = std::async(std::launch::async, [&] {
    return join_rendezvous(kSecret, rank_env(1, 3, chief_addr), a1, std::chrono::seconds(20), &id1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto tasks =
      serve_rendezvous(kSecret, rank_env(0, 3, chief_addr), 0, std::chrono::seconds(20), &id0);
  const cluster_tasks want{{"chief", {chief_addr}}, {"worker", {a1, a2}}};
  CHECK(tasks == want);
  CHECK(r1.get() == want);
  CHECK(r2.get() == want);
  // Each got a certificate naming its task, for its own key, from one job CA.
  CHECK(id0.task == "chief:0");
  CHECK(id1.task == "worker:0");
  CHECK(id2.task == "worker:1");
  for (const auto* id : {&id0, &id1, &id2}) CHECK(check_task_identity(*id) == "");
  CHECK(id1.ca_pem == id0.ca_pem);
  CHECK(id2.ca_pem == id0.ca_pem);
  CHECK(id1.cert_pem != id2.cert_pem);
  // worker:1's certificate is not worker:0's, nor for worker:0's key.
  CHECK(check_task_identity({"worker:0", id2.ca_pem, id2.cert_pem, id1.key_pem}) ==
        "the certificate is not for this task's key");
  CHECK(check_task_identity({"worker:0", id2.ca_pem, id2.cert_pem, id2.key_pem}) ==
        "the certificate does not name worker:0");
}

TEST_CASE("the rendezvous refuses a duplicate rank, naming it, and still forms the cluster") {
  test::captured_log log;  // read once every thread is done
  const auto chief_addr = address(free_port());
  const auto a1 = address(free_port()), a1_again = address(free_port());
  const auto a2 = address(free_port());
  auto chief = std::async(std::launch::async, [&] {
    return serve_rendezvous(kSecret, rank_env(0, 3, chief_addr), 1, std::chrono::seconds(20));
  });
  // Two processes claim rank 1: whichever announces second is refused.
  auto claim_rank_1 = [&](const std::string& at) {
    return std::async(std::launch::async, [&chief_addr, at]() -> std::string {
      try {
        join_rendezvous(kSecret, rank_env(1, 3, chief_addr), at, std::chrono::seconds(20));
        return "joined";
      } catch (const rendezvous_error& e) {
        return e.what();
      }
    });
  };
  auto first = claim_rank_1(a1);
  auto second = claim_rank_1(a1_again);
  // One of them is refused at once; the other waits for rank 2.
  auto& refused_one = first_ready(first, second);
  auto& joined_one = &refused_one == &first ? second : first;
  const auto refused = refused_one.get();
  CHECK(
      refused.starts_with("rank:1: the chief refused this rank: rank 1 already joined from "
                          "127.0.0.1:"));
  // No second certificate for the live rank's task.
  CHECK_MESSAGE(refused.ends_with("; the certificate for ps:0 is not issued again while that "
                                  "connection is open"),
                refused);
  auto last = std::async(std::launch::async, [&] {
    return join_rendezvous(kSecret, rank_env(2, 3, chief_addr), a2, std::chrono::seconds(20));
  });
  auto tasks = chief.get();
  CHECK(tasks.at("chief") == hosts{chief_addr});
  CHECK(tasks.at("worker") == hosts{a2});
  const auto& ps = tasks.at("ps");
  REQUIRE(ps.size() == 1);
  CHECK((ps[0] == a1 || ps[0] == a1_again));
  CHECK(last.get() == tasks);
  // The one that joined returns once the cluster is formed.
  CHECK(joined_one.get() == "joined");
  // The chief logs the refusal, naming the peer and the rank's holder.
  const auto text = log.text();
  CHECK_MESSAGE(text.find("chief:0: rendezvous: refused rank:1 (127.0.0.1:") != std::string::npos,
                text);
  CHECK_MESSAGE(text.find("): rank 1 already joined from 127.0.0.1:") != std::string::npos, text);
  CHECK(text.find("the certificate for ps:0 is not issued again") != std::string::npos);
}

TEST_CASE("the rendezvous reads announces at once: silent connections delay no rank") {
  const auto chief_addr = address(free_port());
  auto chief = std::async(std::launch::async, [&] {
    return serve_rendezvous(kSecret, rank_env(0, 3, chief_addr), 0, std::chrono::seconds(60));
  });
  // Four peers pass the gate first and say nothing: read one at a time,
  // each would hold the rendezvous for its 5 s announce timeout (20 s).
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(admitted_as(chief_addr, "rank:1"));
  const auto start = std::chrono::steady_clock::now();
  const auto a1 = address(free_port()), a2 = address(free_port());
  auto r1 = std::async(std::launch::async, [&] {
    return join_rendezvous(kSecret, rank_env(1, 3, chief_addr), a1, std::chrono::seconds(60));
  });
  auto r2 = std::async(std::launch::async, [&] {
    return join_rendezvous(kSecret, rank_env(2, 3, chief_addr), a2, std::chrono::seconds(60));
  });
  const cluster_tasks want{{"chief", {chief_addr}}, {"worker", {a1, a2}}};
  CHECK(chief.get() == want);
  // A hang guard, far from both: the cluster forms in well under a second,
  // and read one at a time it took at least 20 s.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  CHECK(r1.get() == want);
  CHECK(r2.get() == want);
  // The silent ones are closed, told nothing.
  for (int fd : silent) {
    CHECK(bytes_until_closed(fd, std::chrono::seconds(10)) == 0);
    ::close(fd);
  }
}

TEST_CASE("the rendezvous refuses an announce of another rank than the one proved at the gate") {
  const auto chief_addr = address(free_port());
  auto chief = std::async(std::launch::async, [&] {
    return serve_rendezvous(kSecret, rank_env(0, 2, chief_addr), 0, std::chrono::seconds(20));
  });
  const int fd = admitted_as(chief_addr, "rank:2");
  CHECK(answer_to_announce(fd, 1, 2, address(free_port())) ==
        "the chief refused this rank: it proved the name rank:2 at the gate but announces rank 1");
  ::close(fd);
  const auto a1 = address(free_port());
  CHECK(join_rendezvous(kSecret, rank_env(1, 2, chief_addr), a1, std::chrono::seconds(20)) ==
        cluster_tasks{{"chief", {chief_addr}}, {"worker", {a1}}});
  chief.get();
}

TEST_CASE("the rendezvous frees the rank of a claimant that left before the cluster formed") {
  const auto chief_addr = address(free_port());
  auto chief = std::async(std::launch::async, [&] {
    return serve_rendezvous(kSecret, rank_env(0, 3, chief_addr), 0, std::chrono::seconds(30));
  });
  // Rank 1 announces (a certificate request for its key), then its process
  // dies before rank 2 comes.
  const int gone = admitted_as(chief_addr, "rank:1");
  const task_key gone_key;
  const auto gone_at = address(free_port());
  REQUIRE(net::send_all(gone, signed_announce(1, 3, gone_at, gone_key),
                        std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  const auto issued_to_gone = "rank 1 of 3 joined, listening at " + gone_at;
  const auto first_until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!logs.contains(issued_to_gone) && std::chrono::steady_clock::now() < first_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(logs.contains(issued_to_gone));
  ::close(gone);
  // Its restart claims rank 1 again: refused ("already joined") only until
  // the chief has seen the first connection close, which travels through
  // two TLS links' threads first.
  const auto a1 = address(free_port()), a2 = address(free_port());
  task_identity fresh;
  auto restarted = std::async(std::launch::async, [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      try {
        return join_rendezvous(kSecret, rank_env(1, 3, chief_addr), a1, std::chrono::seconds(30),
                               &fresh);
      } catch (const rendezvous_error& e) {
        if (std::string(e.what()).find("already joined") == std::string::npos ||
            std::chrono::steady_clock::now() > until)
          throw;
      }
    }
  });
  // Rank 2 comes once the restart holds rank 1: had it come while the dead
  // claim still held it, the cluster would have formed with the dead rank,
  // as it must (the chief cannot tell a close still on its way from none).
  const auto held_by_restart = "rank 1 of 3 joined, listening at " + a1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!logs.contains(held_by_restart) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(logs.contains(held_by_restart));
  const auto r2 =
      join_rendezvous(kSecret, rank_env(2, 3, chief_addr), a2, std::chrono::seconds(30));
  const cluster_tasks want{{"chief", {chief_addr}}, {"worker", {a1, a2}}};
  CHECK(chief.get() == want);
  CHECK(restarted.get() == want);
  CHECK(r2 == want);
  // The restart holds a fresh certificate for worker:0: for its own key, not
  // the dead process's.
  CHECK(fresh.task == "worker:0");
  CHECK(check_task_identity(fresh) == "");
  CHECK(check_task_identity({"worker:0", fresh.ca_pem, fresh.cert_pem, gone_key.private_pem()}) ==
        "the certificate is not for this task's key");
}

TEST_CASE("the rendezvous hands out no port it no longer holds: the node's gate takes it over") {
  const auto chief_port = free_port();
  const auto chief_addr = address(chief_port);
  const auto a1 = address(free_port());
  auto r1 = std::async(std::launch::async, [&] {
    return join_rendezvous(kSecret, rank_env(1, 2, chief_addr), a1, std::chrono::seconds(20));
  });
  serve_rendezvous(kSecret, rank_env(0, 2, chief_addr), 0, std::chrono::seconds(20));
  r1.get();
  // The chief's port is still this process's, listening.
  CHECK(port_held(chief_port));
  // Its node's gate listens on that very socket; a rank reaches it.
  gate_options node_opts;
  node_opts.secret = kSecret;
  node_opts.name = "chief:0";
  std::promise<std::string> admitted;
  gate node_gate("127.0.0.1", chief_port, node_opts,
                 [&admitted](int fd, const std::string& name, const std::string&) {
                   ::close(fd);
                   admitted.set_value(name);
                 });
  const int fd = admitted_as(chief_addr, "worker:0");
  ::close(fd);
  auto name = admitted.get_future();
  REQUIRE(name.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(name.get() == "worker:0");
}

TEST_CASE("a rank from the environment announces a port it holds until its node listens there") {
  ::setenv("TROUPE_SECRET", kSecret, 1);
  const auto chief_addr = address(free_port());
  auto chief = std::async(std::launch::async, [&] {
    return serve_rendezvous(kSecret, rank_env(0, 2, chief_addr), 0, std::chrono::seconds(20));
  });
  auto c = parse_job_config({{"name", "held"}, {"cluster", {{"join_timeout_seconds", 20}}}});
  const auto task = join_cluster_from_environment(c, {{"TROUPE_RANK", "1"},
                                                      {"TROUPE_WORLD_SIZE", "2"},
                                                      {"TROUPE_CHIEF", chief_addr},
                                                      {"TROUPE_ADVERTISE_ADDR", "127.0.0.1"}});
  chief.get();
  CHECK(task == task_id{"worker", 0});
  const auto mine = parse_host_port(c.cluster->tasks.at("worker").at(0));
  CHECK(mine.host == "127.0.0.1");
  // Given back to the OS, anyone could have taken it by now.
  CHECK(port_held(mine.port));
  auto again = held_listeners::take("127.0.0.1", mine.port);
  CHECK(again >= 0);
  if (again >= 0) ::close(again);
  CHECK_FALSE(port_held(mine.port));
}

TEST_CASE("the rendezvous: a wrong secret is refused at the gate; timeouts name the chief") {
  const auto chief_addr = address(free_port());
  auto chief = std::async(std::launch::async, [&] {
    return serve_rendezvous(kSecret, rank_env(0, 2, chief_addr), 0, std::chrono::seconds(2));
  });
  std::string wrong;
  // The chief's refusal cannot be authenticated by a rank without the
  // secret (it could be anyone on the port), so the rank retries until its
  // deadline, then names the refusal.
  try {
    join_rendezvous("another-secret-0123456789", rank_env(1, 2, chief_addr), address(free_port()),
                    std::chrono::seconds(1));
  } catch (const rendezvous_error& e) {
    wrong = e.what();
  }
  CHECK_MESSAGE(wrong.starts_with("rank:1: cannot join the chief at " + chief_addr + " within 1 s"),
                wrong);
  CHECK_MESSAGE(wrong.find("wrong or missing cluster secret") != std::string::npos, wrong);
  // Nobody with the secret came: the chief names who is missing.
  CHECK_THROWS_WITH_AS(chief.get(),
                       ("chief:0: rank 1 did not join the chief at " + chief_addr +
                        " within 2 s (cluster.join_timeout_seconds)")
                           .c_str(),
                       rendezvous_error);
  // Nobody listens at the chief's address: a rank gives up naming it.
  const auto nobody = address(free_port());
  std::string unreachable;
  try {
    join_rendezvous(kSecret, rank_env(1, 2, nobody), address(free_port()), std::chrono::seconds(1));
  } catch (const rendezvous_error& e) {
    unreachable = e.what();
  }
  CHECK(unreachable.starts_with("rank:1: cannot join the chief at " + nobody +
                                " within 1 s (cluster.join_timeout_seconds): cannot connect to " +
                                nobody));
}

TEST_CASE("a rank that reaches a chief whose rendezvous is over sends it nothing") {
  // The chief's node gate (named chief:0) in place of its rendezvous.
  const auto port = free_port();
  gate_options node_opts;
  node_opts.secret = kSecret;
  node_opts.name = "chief:0";
  // What the rank sends once admitted, counted until it closes (or 10 s).
  std::promise<long> received;
  gate node_gate("127.0.0.1", port, node_opts,
                 [&received](int fd, const std::string&, const std::string&) {
                   received.set_value(bytes_until_closed(fd, std::chrono::seconds(10)));
                   ::close(fd);
                 });
  CHECK_THROWS_WITH_AS(join_rendezvous(kSecret, rank_env(1, 2, address(port)), address(free_port()),
                                       std::chrono::seconds(5)),
                       ("rank:1: " + address(port) +
                        " is chief:0, not the chief's rendezvous: its job has formed its cluster "
                        "already")
                           .c_str(),
                       rendezvous_error);
  auto count = received.get_future();
  REQUIRE(count.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(count.get() == 0);
}

TEST_CASE("a config without cluster.tasks takes its cluster from the rendezvous, checked") {
  nlohmann::json j = {{"name", "env"},
                      {"strategy", {{"kind", "parameter_server"}, {"replicas", 2}, {"shards", 1}}},
                      {"cluster", {{"roles", {{"ps", 1}}}, {"join_timeout_seconds", 5}}}};
  auto c = parse_job_config(j);
  REQUIRE(c.cluster);
  CHECK(c.cluster->tasks.empty());
  CHECK(c.cluster->ps_ranks == 1);
  // Round trip through the effective config.
  CHECK(parse_job_config(to_json(c)).cluster->ps_ranks == 1);
  j["cluster"]["tasks"] = {{"chief", {"127.0.0.1:7000"}}};
  CHECK_THROWS_WITH_AS(parse_job_config(j),
                       "cluster.roles: is for a cluster from the environment; with cluster.tasks "
                       "written out, place tasks with cluster.hosts instead",
                       config_error);

  // A world of one: the chief alone, no rendezvous.
  ::setenv("TROUPE_SECRET", kSecret, 1);
  auto one = parse_job_config({{"name", "one"}, {"cluster", nlohmann::json::object()}});
  auto task = join_cluster_from_environment(
      one, {{"TROUPE_RANK", "0"}, {"TROUPE_WORLD_SIZE", "1"}, {"TROUPE_CHIEF", "127.0.0.1:7000"}});
  CHECK(task == task_id{"chief", 0});
  CHECK(one.cluster->tasks == cluster_tasks{{"chief", {"127.0.0.1:7000"}}});
  // parameter_server needs a ps task: a world of one fails the same check a
  // hand-written cluster does.
  auto ps = parse_job_config(
      {{"name", "ps"},
       {"strategy", {{"kind", "parameter_server"}, {"replicas", 1}, {"shards", 1}}},
       {"cluster", nlohmann::json::object()}});
  CHECK_THROWS_AS(join_cluster_from_environment(ps, {{"TROUPE_RANK", "0"},
                                                     {"TROUPE_WORLD_SIZE", "1"},
                                                     {"TROUPE_CHIEF", "127.0.0.1:7000"}}),
                  config_error);
}
