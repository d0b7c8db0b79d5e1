// The cluster spec (config/cluster.hpp) and the shared secret (config/secret.hpp).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "config/secret.hpp"
#include "crypto/crypto.hpp"
#include "fixtures.hpp"
#include "net/job_ca.hpp"
#include "net/secure_link.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

// A mirrored job over a chief and two workers.
json mirrored_job() {
  return json::parse(R"({
    "strategy": {"kind": "mirrored", "replicas": 2},
    "devices": ["cpu:0", "cpu:1"],
    "cluster": {"tasks": {"chief": ["127.0.0.1:7000"],
                          "worker": ["127.0.0.1:7001", "127.0.0.1:7002"]}}
  })");
}

json ps_job() {
  return json::parse(R"({
    "strategy": {"kind": "parameter_server", "replicas": 3, "shards": 2},
    "cluster": {"tasks": {"chief": ["127.0.0.1:7000"],
                          "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
                          "ps": ["127.0.0.1:7003", "127.0.0.1:7004"]}}
  })");
}

std::string error_of(const json& j) {
  try {
    parse_job_config(j);
  } catch (const config_error& e) {
    return e.what();
  }
  return "(no error)";
}

// Sets an environment variable for one scope.
struct scoped_env {
  std::string name;
  std::string old;
  bool had = false;
  scoped_env(std::string n, const char* value) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) {
      had = true;
      old = o;
    }
    if (value)
      ::setenv(name.c_str(), value, 1);
    else
      ::unsetenv(name.c_str());
  }
  ~scoped_env() {
    if (had)
      ::setenv(name.c_str(), old.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
}

}  // namespace

TEST_CASE("cluster: task names") {
  auto t = parse_task_name("worker:1");
  CHECK(t.job == "worker");
  CHECK(t.index == 1);
  CHECK(t.str() == "worker:1");
  CHECK(parse_task_name("chief:0") == task_id{"chief", 0});
  CHECK_THROWS_WITH(parse_task_name("worker"),
                    "expected a task name \"job:index\" like \"worker:1\", got \"worker\"");
  CHECK_THROWS_WITH(parse_task_name("wroker:1"),
                    doctest::Contains("unknown job \"wroker\" in task name \"wroker:1\""));
  CHECK_THROWS_WITH(parse_task_name("worker:x"), doctest::Contains("decimal index"));
  CHECK_THROWS_WITH(parse_task_name("worker:-1"), doctest::Contains("decimal index"));
  CHECK_THROWS_WITH(parse_task_name("worker:01"), doctest::Contains("decimal index"));
  CHECK_THROWS_WITH(parse_task_name("worker:"), doctest::Contains("decimal index"));
}

TEST_CASE("cluster: host:port") {
  auto hp = parse_host_port("127.0.0.1:7000");
  CHECK(hp.host == "127.0.0.1");
  CHECK(hp.port == 7000);
  CHECK(parse_host_port("node-3.example.org:65535").port == 65535);
  auto v6 = parse_host_port("[::1]:7001");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 7001);
  CHECK_THROWS_WITH(parse_host_port("x"), "expected \"host:port\", got \"x\"");
  CHECK_THROWS_WITH(parse_host_port(":7000"), doctest::Contains("expected \"host:port\""));
  CHECK_THROWS_WITH(parse_host_port("h:"), doctest::Contains("expected \"host:port\""));
  CHECK_THROWS_WITH(parse_host_port("h:+1"), doctest::Contains("expected \"host:port\""));
  CHECK_THROWS_WITH(parse_host_port("h i:1"), doctest::Contains("expected \"host:port\""));
  CHECK_THROWS_WITH(parse_host_port("h:0"),
                    "expected \"host:port\" with a port in 1..65535, got \"h:0\"");
  CHECK_THROWS_WITH(parse_host_port("h:65536"), doctest::Contains("1..65535"));
  CHECK_THROWS_WITH(parse_host_port("h:99999999999"), doctest::Contains("1..65535"));
}

TEST_CASE("cluster: parsed from the job, tasks in a stable order, addresses") {
  auto c = parse_job_config(ps_job());
  REQUIRE(c.cluster);
  auto tasks = all_tasks(*c.cluster);
  std::vector<std::string> names;
  for (const auto& t : tasks) names.push_back(t.str());
  CHECK(names == std::vector<std::string>{"chief:0", "worker:0", "worker:1", "ps:0", "ps:1"});
  CHECK(task_address(*c.cluster, {"worker", 1}) == "127.0.0.1:7002");
  CHECK(task_address(*c.cluster, {"ps", 0}) == "127.0.0.1:7003");
  CHECK_THROWS_WITH(task_address(*c.cluster, {"worker", 2}),
                    "no task worker:2 in the cluster spec (worker has tasks worker:0..worker:1)");
  CHECK(c.cluster->join_timeout_seconds == 30);
  CHECK(c.cluster->heartbeat_seconds == 1);
  CHECK(c.cluster->secret_env == "TROUPE_SECRET");
  // No cluster: a single-process job.
  CHECK_FALSE(parse_job_config(json::object()).cluster);
}

TEST_CASE("cluster: to_json round-trips") {
  auto j = mirrored_job();
  j["cluster"]["hosts"] = {{"worker:0", {{"replicas", {1}}, {"devices", {"cpu:1"}}}},
                           {"worker:1", {{"replicas", {0}}}}};
  j["cluster"]["join_timeout_seconds"] = 12.5;
  j["cluster"]["secret_env"] = "MY_SECRET";
  auto c = parse_job_config(j);
  json out = to_json(c);
  CHECK(out["cluster"]["tasks"]["worker"][1] == "127.0.0.1:7002");
  CHECK(out["cluster"]["join_timeout_seconds"] == 12.5);
  CHECK(out["cluster"]["secret_env"] == "MY_SECRET");
  CHECK(to_json(parse_job_config(out)) == out);
  CHECK_FALSE(to_json(parse_job_config(json::object())).contains("cluster"));
}

TEST_CASE("cluster: bad entries are named by their JSON path") {
  auto set_worker = [](const json& addr) {
    auto j = mirrored_job();
    j["cluster"]["tasks"]["worker"][1] = addr;
    return error_of(j);
  };
  CHECK(set_worker("x") == "cluster.tasks.worker[1]: expected \"host:port\", got \"x\"");
  CHECK(set_worker("127.0.0.1:70000") ==
        "cluster.tasks.worker[1]: expected \"host:port\" with a port in 1..65535, got "
        "\"127.0.0.1:70000\"");
  CHECK(set_worker(7001) == "cluster.tasks.worker[1]: expected \"host:port\", got 7001");
  CHECK(set_worker("127.0.0.1:7000") ==
        "cluster.tasks.worker[1]: duplicate address \"127.0.0.1:7000\" (already "
        "cluster.tasks.chief[0])");
  CHECK(set_worker("LOCALHOST:7009") == "(no error)");

  auto j = mirrored_job();
  j["cluster"]["tasks"]["wroker"] = j["cluster"]["tasks"]["worker"];
  j["cluster"]["tasks"].erase("worker");
  CHECK(error_of(j) == "cluster.tasks.wroker: unknown key; did you mean \"worker\"?");

  j = mirrored_job();
  j["cluster"]["tasks"].erase("chief");
  CHECK(error_of(j) ==
        "cluster.tasks.chief: missing; a cluster needs exactly one chief task (it runs the "
        "coordinator)");
  j = mirrored_job();
  j["cluster"]["tasks"]["chief"] = {"127.0.0.1:7000", "127.0.0.1:7005"};
  CHECK(error_of(j) == "cluster.tasks.chief: expected exactly one address (one chief task), got 2");
  j = mirrored_job();
  j["cluster"]["tasks"]["worker"] = json::array();
  CHECK(error_of(j) ==
        "cluster.tasks.worker: expected a non-empty array of \"host:port\" strings, got []");
  j = mirrored_job();
  j["cluster"]["tasks"] = json::object();
  CHECK(error_of(j).starts_with("cluster.tasks.chief: missing"));
  j = mirrored_job();
  j["cluster"].erase("tasks");  // the cluster from the environment (test_cluster_env.cpp)
  CHECK(error_of(j) == "(no error)");
  j = mirrored_job();
  j["cluster"]["heartbeat_seconds"] = 0;
  CHECK(error_of(j) == "cluster.heartbeat_seconds: expected a number > 0, got 0");
  j = mirrored_job();
  j["cluster"]["secret_env"] = "1BAD-NAME";
  CHECK(error_of(j).starts_with("cluster.secret_env: expected an environment variable name"));
  j = mirrored_job();
  j["cluster"]["secret"] = "hunter2";
  CHECK(error_of(j).starts_with("cluster.secret: unknown key"));
}

TEST_CASE("cluster: identity, and the links it picks with an identity issued by the job CA") {
  auto j = ps_job();
  CHECK(parse_job_config(j).cluster->identity == cluster_spec::identity_mode::job_ca);
  j["cluster"]["identity"] = "shared_secret";
  auto shared = parse_job_config(j);
  CHECK(shared.cluster->identity == cluster_spec::identity_mode::shared_secret);
  auto out = to_json(shared);
  CHECK(to_json(parse_job_config(out)) == out);
  j["cluster"]["identity"] = "per_task";
  CHECK(error_of(j) ==
        "cluster.identity: expected \"job_ca\" or \"shared_secret\", got \"per_task\"");

  // A process issued an identity at the rendezvous: its links use it under
  // job_ca; shared_secret keys them from the secret; cluster.tls wins.
  const job_authority ca;
  issued_identity::keep(ca.issue_self("worker:0"));
  const std::string secret = "a-secret-of-enough-length";
  auto by_ca = link_security_for(*parse_job_config(ps_job()).cluster, secret, 1 << 20);
  CHECK(by_ca.kind == link_security::trust::certificates);
  REQUIRE(by_ca.identity);
  CHECK(by_ca.identity->task == "worker:0");
  CHECK_NOTHROW(check_link_security(by_ca));
  CHECK(link_security_for(*shared.cluster, secret, 1 << 20).kind == link_security::trust::psk);
  auto files = ps_job();
  files["cluster"]["tls"] = {{"ca", "ca.pem"}, {"cert", "w.pem"}, {"key", "w.key"}};
  auto with_files = link_security_for(*parse_job_config(files).cluster, secret, 1 << 20);
  CHECK(with_files.ca_file == "ca.pem");
  CHECK_FALSE(with_files.identity);
  issued_identity::forget();
  CHECK(link_security_for(*parse_job_config(ps_job()).cluster, secret, 1 << 20).kind ==
        link_security::trust::psk);
}

TEST_CASE("cluster: tls, insecure and max_message_mb") {
  auto j = ps_job();
  j["cluster"]["tls"] = {{"ca", "ca.pem"}, {"cert", "w.pem"}, {"key", "w.key"}};
  j["cluster"]["max_message_mb"] = 48.5;
  auto c = parse_job_config(j);
  CHECK(c.cluster->tls.ca == "ca.pem");
  CHECK(c.cluster->tls.key == "w.key");
  CHECK(c.cluster->max_message_mb == 48.5);
  CHECK_FALSE(c.cluster->insecure);
  auto out = to_json(c);
  CHECK(to_json(parse_job_config(out)) == out);
  auto security = link_security_for(*c.cluster, "", 1 << 20);
  CHECK(security.kind == link_security::trust::certificates);
  CHECK(security.max_frame_bytes == static_cast<uint64_t>(48.5 * (1 << 20)));

  auto bad = ps_job();
  bad["cluster"]["tls"] = {{"ca", "ca.pem"}, {"cert", "w.pem"}};
  CHECK(error_of(bad).starts_with("cluster.tls.key: missing"));
  bad["cluster"]["tls"] = {{"ca", "ca.pem"}, {"cert", ""}, {"key", "k"}};
  CHECK(error_of(bad).starts_with("cluster.tls.cert:"));
  bad = ps_job();
  bad["cluster"]["insecure"] = "yes";
  CHECK(error_of(bad).starts_with("cluster.insecure: expected true or false"));
  bad["cluster"]["insecure"] = true;
  bad["cluster"]["tls"] = {{"ca", "a"}, {"cert", "b"}, {"key", "c"}};
  CHECK(error_of(bad).starts_with("cluster.insecure: true turns TLS off"));
  bad = ps_job();
  bad["cluster"]["max_message_mb"] = -1;
  CHECK(error_of(bad).starts_with("cluster.max_message_mb:"));

  auto plain = ps_job();
  plain["cluster"]["insecure"] = true;
  auto p = parse_job_config(plain);
  CHECK(link_security_for(*p.cluster, "", 1 << 20).kind == link_security::trust::insecure);
  // The default: a key derived from the secret, never the secret itself.
  auto d = parse_job_config(ps_job());
  auto psk = link_security_for(*d.cluster, "a-secret-of-enough-length", 1 << 20);
  CHECK(psk.kind == link_security::trust::psk);
  CHECK(psk.psk_key == derive_key("a-secret-of-enough-length", key_purpose::tls_psk));
  CHECK(psk.max_frame_bytes == (1u << 20));
  CHECK_THROWS_AS(link_security_for(*d.cluster, "", 1 << 20), link_error);
}

TEST_CASE("cluster: default placement") {
  SUBCASE("mirrored: replicas in blocks over the workers, the chief coordinates") {
    auto j = mirrored_job();
    j["strategy"]["replicas"] = 5;
    auto p = resolve_placement(parse_job_config(j));
    REQUIRE(p.size() == 3);
    CHECK(p[0].task.str() == "chief:0");
    CHECK(p[0].coordinator);
    CHECK(p[0].replicas.empty());
    CHECK_FALSE(p[0].input_pipeline());
    CHECK(p[1].replicas == std::vector<int64_t>{0, 1, 2});
    CHECK(p[1].devices == std::vector<std::string>{"cpu:0", "cpu:1", "cpu:0"});
    CHECK(p[1].input_pipeline());
    CHECK(p[2].replicas == std::vector<int64_t>{3, 4});
    CHECK(p[2].devices == std::vector<std::string>{"cpu:1", "cpu:0"});
  }
  SUBCASE("mirrored without workers: everything on the chief") {
    auto j = mirrored_job();
    j["cluster"]["tasks"].erase("worker");
    auto p = resolve_placement(parse_job_config(j));
    REQUIRE(p.size() == 1);
    CHECK(p[0].replicas == std::vector<int64_t>{0, 1});
  }
  SUBCASE("a spec left to the environment has no chief yet: refused, not a crash") {
    // Found by fuzz_cluster: resolve_placement met a spec without tasks.
    auto j = mirrored_job();
    j["cluster"].erase("tasks");
    auto c = parse_job_config(j);
    REQUIRE(c.cluster);
    CHECK(c.cluster->tasks.empty());
    CHECK_THROWS_AS(resolve_placement(c), config_error);
    CHECK_THROWS_WITH(resolve_placement(c), doctest::Contains("cluster.tasks.chief: missing"));
  }
  SUBCASE("parameter_server: shards on ps, workers on workers") {
    auto c = parse_job_config(ps_job());
    auto p = resolve_placement(c);
    CHECK(placement_of(p, {"worker", 0}).replicas == std::vector<int64_t>{0, 1});
    CHECK(placement_of(p, {"worker", 1}).replicas == std::vector<int64_t>{2});
    CHECK(placement_of(p, {"ps", 0}).shards == std::vector<int64_t>{0});
    CHECK(placement_of(p, {"ps", 1}).shards == std::vector<int64_t>{1});
    CHECK(placement_of(p, {"chief", 0}).shards.empty());
    CHECK_THROWS_AS(placement_of(p, {"ps", 2}), std::out_of_range);
  }
  SUBCASE("central_storage without ps: shards on the chief") {
    auto j = mirrored_job();
    j["strategy"]["kind"] = "central_storage";
    j["strategy"]["shards"] = 2;
    auto p = resolve_placement(parse_job_config(j));
    CHECK(placement_of(p, {"chief", 0}).shards == std::vector<int64_t>{0, 1});
  }
}

TEST_CASE("cluster: the strategy needs task kinds the spec has") {
  auto j = ps_job();
  j["cluster"]["tasks"].erase("ps");
  CHECK(error_of(j) ==
        "cluster.tasks: strategy.kind \"parameter_server\" needs a \"ps\" job with at least one "
        "task (the variable shards live there)");
  j = ps_job();
  j["cluster"]["tasks"].erase("worker");
  CHECK(
      error_of(j).starts_with("cluster.tasks: strategy.kind \"parameter_server\" needs a "
                              "\"worker\" job"));
  j = mirrored_job();
  j["cluster"]["tasks"]["ps"] = {"127.0.0.1:7010"};
  CHECK(error_of(j).starts_with("cluster.tasks.ps: the mirrored strategy has no variable shards"));
  j = mirrored_job();
  j["strategy"]["replicas"] = 1;
  CHECK(error_of(j) ==
        "strategy.replicas: expected >= the 2 worker tasks of cluster.tasks.worker (each hosts "
        "at least one replica), got 1");
  j = ps_job();
  j["strategy"]["shards"] = 1;
  CHECK(error_of(j).starts_with("strategy.shards: expected >= the 2 ps tasks"));
}

TEST_CASE("cluster: an explicit hosts override") {
  auto j = mirrored_job();
  j["cluster"]["hosts"] = {{"worker:0", {{"replicas", {1}}, {"devices", {"cpu:1"}}}},
                           {"worker:1", {{"replicas", {0}}}}};
  auto p = resolve_placement(parse_job_config(j));
  CHECK(placement_of(p, {"worker", 0}).replicas == std::vector<int64_t>{1});
  CHECK(placement_of(p, {"worker", 0}).devices == std::vector<std::string>{"cpu:1"});
  CHECK(placement_of(p, {"worker", 1}).devices == std::vector<std::string>{"cpu:0"});

  auto with_hosts = [](json hosts) {
    auto j = mirrored_job();
    j["cluster"]["hosts"] = std::move(hosts);
    return error_of(j);
  };
  CHECK(with_hosts({{"worker:5", {{"replicas", {0, 1}}}}}) ==
        "cluster.hosts.worker:5: no task worker:5 in cluster.tasks (cluster.tasks.worker has 2 "
        "tasks: worker:0..worker:1)");
  CHECK(with_hosts({{"ps:0", {{"replicas", {0, 1}}}}}) ==
        "cluster.hosts.ps:0: no task ps:0 in cluster.tasks (it has no \"ps\" job)");
  // A control character in a key (a newline) stays escaped: the error is one
  // line, naming the key as JSON writes it.
  auto two_lines = with_hosts({{"worker:0\nworker:1", {{"replicas", {0, 1}}}}});
  CHECK_MESSAGE(two_lines.find('\n') == std::string::npos, two_lines);
  CHECK(two_lines.rfind("cluster.hosts[\"worker:0\\nworker:1\"]: ", 0) == 0);
  CHECK(two_lines.find("\"worker:0\\nworker:1\"") != std::string::npos);
  auto bell = with_hosts({{"worker:\x07", {{"replicas", {0, 1}}}}});
  CHECK_MESSAGE(bell.find('\x07') == std::string::npos, bell);
  CHECK(with_hosts({{"worker", {{"replicas", {0, 1}}}}}) ==
        "cluster.hosts.worker: expected a task name \"job:index\" like \"worker:1\", got "
        "\"worker\"");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0, 2}}}}}) ==
        "cluster.hosts.worker:0.replicas[1]: expected an integer in [0, 1] (strategy.replicas "
        "is 2), got 2");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0}}}}, {"worker:1", {{"replicas", {0, 1}}}}}) ==
        "cluster.hosts.worker:1.replicas[0]: replica 0 is already placed on worker:0");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0}}}}, {"worker:1", json::object()}}) ==
        "cluster.hosts: replica 1 is not placed on any task (strategy.replicas is 2)");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0, 1}}}}}) ==
        "cluster.hosts: task worker:1 hosts nothing; place replicas or shards on it, or remove "
        "it from cluster.tasks");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0}}, {"devices", {"cpu:0", "cpu:1"}}}},
                    {"worker:1", {{"replicas", {1}}}}}) ==
        "cluster.hosts.worker:0.devices: expected one device per replica (1), got 2");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0}}, {"devices", {"gpu:0"}}}},
                    {"worker:1", {{"replicas", {1}}}}}) ==
        "cluster.hosts.worker:0.devices[0]: expected \"cpu:N\" or \"cuda:N\", got \"gpu:0\"");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0}}, {"shards", {0}}}},
                    {"worker:1", {{"replicas", {1}}}}}) ==
        "cluster.hosts.worker:0.shards: the mirrored strategy has no variable shards");
  CHECK(with_hosts({{"worker:0", {{"replicas", {0}}, {"replica", {1}}}}}) ==
        "cluster.hosts.worker:0.replica: unknown key; did you mean \"replicas\"?");

  auto k = ps_job();
  k["cluster"]["hosts"] = {{"worker:0", {{"replicas", {0, 1, 2}}}},
                           {"worker:1", {{"replicas", json::array()}, {"shards", {0}}}},
                           {"ps:0", {{"shards", {1}}}},
                           {"ps:1", {{"shards", {1}}}}};
  CHECK(error_of(k) == "cluster.hosts.ps:1.shards[0]: shard 1 is already placed on ps:0");
}

// ------------------------------------------------------------------ secret

TEST_CASE("secret: a key per purpose, by HKDF-SHA256 under troupe's salt") {
  const std::string secret = "0123456789abcdef0123456789abcdef";
  auto gate = derive_key(secret, key_purpose::gate);
  CHECK(gate.size() == 32);
  // The same key as the hand-written HKDF of earlier builds computed.
  CHECK(crypto::to_hex(gate) == "8f4f91a1d8721bb1c3007bad9e6fd3bc962af2ca10f5d8a617bde9cd39346641");
  CHECK(gate == derive_key(secret, key_purpose::gate));
  CHECK(gate != derive_key(secret, key_purpose::node_handshake));
  CHECK(derive_key(secret, key_purpose::tls_psk) !=
        derive_key(secret, key_purpose::node_handshake));
  CHECK(gate != derive_key(secret + "x", key_purpose::gate));
  CHECK(gate.find(secret) == std::string::npos);
}

TEST_CASE("secret: challenge and response") {
  const std::string secret = "0123456789abcdef0123456789abcdef";
  auto c = make_challenge();
  CHECK(c.size() == 64);
  CHECK(c != make_challenge());
  auto r = challenge_response(secret, c, "worker:1");
  CHECK(r.size() == 64);
  CHECK(verify_challenge_response(secret, c, "worker:1", r));
  // A wrong secret, another challenge, another prover, garbage, nothing: refused.
  CHECK_FALSE(verify_challenge_response(secret, c, "worker:1",
                                        challenge_response(secret + "x", c, "worker:1")));
  CHECK_FALSE(
      verify_challenge_response(secret, c, "worker:1", challenge_response("", c, "worker:1")));
  CHECK_FALSE(verify_challenge_response(secret, make_challenge(), "worker:1", r));
  CHECK_FALSE(verify_challenge_response(secret, c, "worker:0", r));
  CHECK_FALSE(verify_challenge_response(secret, c, "worker:1", ""));
  CHECK_FALSE(verify_challenge_response(secret, c, "worker:1", r.substr(0, 63)));
  CHECK_FALSE(verify_challenge_response(secret, c, "worker:1", secret));
  CHECK_FALSE(verify_challenge_response("", c, "worker:1", challenge_response("", c, "worker:1")));
}

// `openssl rand -hex 32`, once.
constexpr const char* kStrongSecret =
    "4f1c9a07d2b86e35c0a7f49e12d85b6ae3907c4d5f61b28a9e0d3c7b14f6a852";

TEST_CASE("secret: the entropy estimate") {
  auto bits = [](std::string_view s) { return estimate_secret_entropy(s).bits; };
  // Random hex: 4 bits a digit.
  CHECK(estimate_secret_entropy(kStrongSecret).alphabet == 16);
  CHECK(bits(kStrongSecret) == doctest::Approx(256));
  CHECK(bits("0f1e2d3c4b5a69788796a5b4c3d2e1f0") == doctest::Approx(128));
  // Decimal, mixed classes, any byte.
  CHECK(estimate_secret_entropy("8405719263").alphabet == 10);
  CHECK(estimate_secret_entropy("Zq7!").alphabet == 95);
  CHECK(estimate_secret_entropy(std::string("k\x01", 2)).alphabet == 256);
  // Runs count 1 bit a byte after their first two.
  CHECK(bits("0123456789") == doctest::Approx(2 * std::log2(10.0) + 8));
  CHECK(bits("zzzz") == doctest::Approx(std::log2(26.0)));  // a repeat of "z"
  // A repeated piece counts once.
  CHECK(bits("q8Vx2Lq8Vx2Lq8Vx2L") == doctest::Approx(bits("q8Vx2L")));
  // Common words count 6 bits whole, in any case.
  const auto words = estimate_secret_entropy("Troupe-SECRET");
  CHECK(words.bits == doctest::Approx(6 + std::log2(26.0 + 26 + 33) + 6));
  CHECK(words.discounted.find("the word \"troupe\"") != std::string::npos);
  CHECK(words.discounted.find("the word \"secret\"") != std::string::npos);
  CHECK(estimate_secret_entropy("test-Q7x-test-w9v").discounted == "the word \"test\"");
  CHECK(bits("") == 0);
}

TEST_CASE("secret: placeholders and guessable secrets are refused, naming the source") {
  const std::string env = "the environment variable TROUPE_SECRET";
  CHECK(check_cluster_secret(kStrongSecret, env) == kStrongSecret);
  CHECK(check_cluster_secret("0f1e2d3c4b5a69788796a5b4c3d2e1f0", env).size() == 32);
  // What deploy/kubernetes/secret.yaml once shipped.
  CHECK_THROWS_WITH_AS(check_cluster_secret("replace-me-with-openssl-rand-hex-32", env),
                       doctest::Contains("the environment variable TROUPE_SECRET holds the "
                                         "placeholder secret shipped in an earlier "
                                         "deploy/kubernetes/secret.yaml"),
                       secret_error);
  CHECK_THROWS_WITH(check_cluster_secret("please-CHANGEME-4f1c9a07d2b86e35c0a7f4", env),
                    doctest::Contains("a placeholder secret (it contains \"changeme\")"));
  // The tests' old fixed secret: words and a run, about 56 bits.
  const std::string file = "cluster.secret_file \"/run/secret\"";
  CHECK_THROWS_WITH_AS(
      check_cluster_secret("troupe-test-secret-0123456789", file),
      doctest::Contains("cluster.secret_file \"/run/secret\" holds a guessable secret: about 56 "
                        "bits of entropy by troupe's estimate (29 bytes from a 69-symbol "
                        "alphabet; less for the word \"troupe\""),
      secret_error);
  CHECK_THROWS_WITH(check_cluster_secret("troupe-test-secret-0123456789", file),
                    doctest::Contains("under the 112 bits required; make one with `openssl "
                                      "rand -hex 32`"));
  // Long is not enough: 40 bytes of one letter, a short phrase repeated.
  CHECK_THROWS_WITH(check_cluster_secret(std::string(40, 'a'), env),
                    doctest::Contains("about 4 bits"));
  CHECK_THROWS_WITH(check_cluster_secret("abc123abc123abc123abc123abc123", env),
                    doctest::Contains("a repeat of its first 6 byte(s)"));
  // The secret itself never appears in the message.
  try {
    check_cluster_secret("zebrazebrazebrazebra", env);
    FAIL("a guessable secret passed");
  } catch (const secret_error& e) {
    CHECK(std::string(e.what()).find("zebra") == std::string::npos);
  }
}

TEST_CASE("secret: from the environment") {
  cluster_spec spec;
  spec.secret_env = "TROUPE_TEST_SECRET_ENV";
  {
    scoped_env e(spec.secret_env, kStrongSecret);
    CHECK(load_cluster_secret(spec) == kStrongSecret);
  }
  {
    scoped_env e(spec.secret_env, nullptr);
    CHECK_THROWS_WITH_AS(load_cluster_secret(spec),
                         doctest::Contains("environment variable TROUPE_TEST_SECRET_ENV is not "
                                           "set and cluster.secret_file is empty"),
                         secret_error);
  }
  {
    scoped_env e(spec.secret_env, "");
    CHECK_THROWS_WITH(load_cluster_secret(spec),
                      doctest::Contains("TROUPE_TEST_SECRET_ENV is empty"));
  }
  {
    scoped_env e(spec.secret_env, "short");
    CHECK_THROWS_WITH(load_cluster_secret(spec), doctest::Contains("use at least 16 bytes"));
  }
}

TEST_CASE("secret: from a file, refused when others may read it") {
  test::temp_dir dir;
  cluster_spec spec;
  spec.secret_env = "TROUPE_TEST_SECRET_UNUSED";
  scoped_env e(spec.secret_env, "the-env-is-not-used-when-a-file-is-set");
  spec.secret_file = dir / "secret";
  write_file(spec.secret_file, std::string(kStrongSecret) + "\n", 0600);
  CHECK(load_cluster_secret(spec) == kStrongSecret);

  write_file(spec.secret_file, std::string(kStrongSecret) + "\n", 0644);
  CHECK_THROWS_WITH_AS(load_cluster_secret(spec),
                       ("permissions 0644 for cluster.secret_file \"" + spec.secret_file +
                        "\" are too open: group and others must have no access (chmod 600 the "
                        "file)")
                           .c_str(),
                       secret_error);
  write_file(spec.secret_file, std::string(kStrongSecret) + "\n", 0640);
  CHECK_THROWS_WITH(load_cluster_secret(spec), doctest::Contains("permissions 0640"));
  write_file(spec.secret_file, std::string(kStrongSecret) + "\n", 0602);
  CHECK_THROWS_WITH(load_cluster_secret(spec), doctest::Contains("permissions 0602"));

  write_file(spec.secret_file, "\n", 0600);
  CHECK_THROWS_WITH(load_cluster_secret(spec), doctest::Contains("is empty"));

  spec.secret_file = dir / "missing";
  const std::string missing =
      "cannot open cluster.secret_file \"" + spec.secret_file + "\": No such file or directory";
  CHECK_THROWS_WITH(load_cluster_secret(spec), doctest::Contains(missing.c_str()));
  spec.secret_file = dir.str();
  CHECK_THROWS_WITH(load_cluster_secret(spec), doctest::Contains("not a regular file"));
}
