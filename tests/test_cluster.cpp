// The cluster spec (config/cluster.hpp) and the shared secret (config/secret.hpp).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "config/secret.hpp"
#include "fixtures.hpp"
#include "runtime/secure_link.hpp"

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

TEST_CASE("secret: SHA-256 and HMAC-SHA256 test vectors") {
  // FIPS 180-4 / NIST CSRC examples.
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // 55, 56 and 64 bytes: the padding's edge cases.
  CHECK(to_hex(sha256(std::string(55, 'a'))) ==
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(to_hex(sha256(std::string(56, 'a'))) ==
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(to_hex(sha256(std::string(64, 'a'))) ==
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  // RFC 4231 test cases 1, 2 and 6 (a key longer than the block).
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("secret: HKDF-SHA256 test vectors and a key per purpose") {
  auto hex = [](const std::string& bytes) {
    std::string out;
    for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
    return out;
  };
  std::string salt, info;
  for (int i = 0; i <= 0x0c; ++i) salt += static_cast<char>(i);
  for (int i = 0xf0; i <= 0xf9; ++i) info += static_cast<char>(i);
  // RFC 5869 test cases 1 and 3 (no salt, no info).
  CHECK(hex(hkdf_sha256(salt, std::string(22, '\x0b'), info, 42)) ==
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  CHECK(hex(hkdf_sha256("", std::string(22, '\x0b'), "", 42)) ==
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
  const std::string secret = "0123456789abcdef0123456789abcdef";
  auto gate = derive_key(secret, key_purpose::gate);
  CHECK(gate.size() == 32);
  CHECK(gate == derive_key(secret, key_purpose::gate));
  CHECK(gate != derive_key(secret, key_purpose::node_handshake));
  CHECK(derive_key(secret, key_purpose::tls_psk) !=
        derive_key(secret, key_purpose::node_handshake));
  CHECK(gate != derive_key(secret + "x", key_purpose::gate));
  CHECK(gate.find(secret) == std::string::npos);
}

TEST_CASE("secret: constant-time comparison") {
  CHECK(constant_time_equal("", ""));
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "abcd"));
  CHECK_FALSE(constant_time_equal("abc", ""));
  CHECK_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
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

TEST_CASE("secret: from the environment") {
  cluster_spec spec;
  spec.secret_env = "TROUPE_TEST_SECRET_ENV";
  {
    scoped_env e(spec.secret_env, "a-long-enough-secret-value");
    CHECK(load_cluster_secret(spec) == "a-long-enough-secret-value");
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
  write_file(spec.secret_file, "file-secret-0123456789\n", 0600);
  CHECK(load_cluster_secret(spec) == "file-secret-0123456789");

  write_file(spec.secret_file, "file-secret-0123456789\n", 0644);
  CHECK_THROWS_WITH_AS(load_cluster_secret(spec),
                       ("permissions 0644 for cluster.secret_file \"" + spec.secret_file +
                        "\" are too open: group and others must have no access (chmod 600 the "
                        "file)")
                           .c_str(),
                       secret_error);
  write_file(spec.secret_file, "file-secret-0123456789\n", 0640);
  CHECK_THROWS_WITH(load_cluster_secret(spec), doctest::Contains("permissions 0640"));
  write_file(spec.secret_file, "file-secret-0123456789\n", 0602);
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
