// bench_remote_allreduce: ring all-reduce between 2 processes on 127.0.0.1
// over CAF's middleman (actors/reducers/remote_ring.hpp).
//
//   bench_remote_allreduce [--sizes-mb=1,16,64] [--iters=10] [--chunk-kb=1024]
//                          [--window=8] [--reads=N] [--workers=N] [--threads=N]
//                          [--heartbeat-ms=200] [--mm-thread=1] [--gate=0]
//                          [--tls=psk|insecure]
//
// Starts itself as rank 1 (`--peer ...`), publishes rank 0 on a free port,
// and for each size runs 2 warm-up + `iters` mean all-reduces of that many
// bytes of float32 on both ranks. Prints one JSON line per size: median time
// on rank 0 and busbw = bytes / time * 2(P-1)/P (P = 2).
// --reads sets middleman.max-consecutive-reads (default: CAF's 50),
// --workers middleman.workers (threads that deserialize and deliver incoming
// BASP messages; net_system_config's default: 0, CAF's: min(3, cores / 4) + 1), --threads
// scheduler.max-threads (actor threads; CAF's default: the number of cores),
// --heartbeat-ms middleman.heartbeat-interval (0: off; net_system_config's
// default: 200 ms, connection timeout 2 s), --mm-thread=0 runs the ring
// nodes as plain actors instead of on the middleman's thread
// (ring_options::on_middleman_thread), --gate=1 connects the ranks through
// troupe node's gate (net/gate.hpp) instead of CAF's publish/remote_actor
// and TLS 1.3 after it (net/secure_link.hpp); --tls=insecure keeps the
// gate and its frame guard but no encryption (cluster.insecure), to measure
// what TLS costs. Rank 1 stays until rank 0
// closes its stdin (rank 0's last collective waits for rank 1's last acknowledgement).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "actors/net_system_config.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "config/secret.hpp"
#include "net/gate.hpp"

extern char** environ;

namespace {

using namespace troupe;
using clk = std::chrono::steady_clock;

struct options {
  std::vector<int64_t> sizes_mb = {1, 16, 64};
  int iters = 10;
  int64_t chunk_kb = 1024;
  int32_t window = 8;
  int64_t reads = 0;
  int64_t workers = -1;
  int64_t threads = 0;
  int64_t heartbeat_ms = 200;
  bool mm_thread = true;
  bool gate = false;
  bool tls = true;  // with --gate: TLS 1.3 (psk), or plaintext (insecure)
  // peer mode
  int peer_port = -1;
};

std::string value_of(const std::string& a, const std::string& key) {
  return a.rfind(key, 0) == 0 ? a.substr(key.size()) : std::string{};
}

void parse_one(options& o, const std::string& a) {
  if (auto v = value_of(a, "--sizes-mb="); !v.empty()) {
    o.sizes_mb.clear();
    std::stringstream ss(v);
    for (std::string x; std::getline(ss, x, ',');) o.sizes_mb.push_back(std::stoll(x));
  } else if (auto v = value_of(a, "--iters="); !v.empty()) {
    o.iters = std::stoi(v);
  } else if (auto v = value_of(a, "--chunk-kb="); !v.empty()) {
    o.chunk_kb = std::stoll(v);
  } else if (auto v = value_of(a, "--window="); !v.empty()) {
    o.window = std::stoi(v);
  } else if (auto v = value_of(a, "--reads="); !v.empty()) {
    o.reads = std::stoll(v);
  } else if (auto v = value_of(a, "--workers="); !v.empty()) {
    o.workers = std::stoll(v);
  } else if (auto v = value_of(a, "--threads="); !v.empty()) {
    o.threads = std::stoll(v);
  } else if (auto v = value_of(a, "--heartbeat-ms="); !v.empty()) {
    o.heartbeat_ms = std::stoll(v);
  } else if (auto v = value_of(a, "--mm-thread="); !v.empty()) {
    o.mm_thread = v != "0";
  } else if (auto v = value_of(a, "--gate="); !v.empty()) {
    o.gate = std::stoi(v) != 0;
  } else if (auto v = value_of(a, "--tls="); !v.empty()) {
    if (v != "psk" && v != "insecure") {
      std::cerr << "--tls: expected psk or insecure, got " << v << "\n";
      std::exit(2);
    }
    o.tls = v == "psk";
  } else if (auto v = value_of(a, "--peer="); !v.empty()) {
    o.peer_port = std::stoi(v);
  } else {
    std::cerr << "unknown argument " << a << "\n";
    std::exit(2);
  }
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    try {
      parse_one(o, a);
    } catch (const std::invalid_argument&) {
      std::cerr << "bad value in " << a << ": expected a number (or a list of them)\n";
      std::exit(2);
    } catch (const std::out_of_range&) {
      std::cerr << "bad value in " << a << ": out of range\n";
      std::exit(2);
    }
  }
  // A zero or negative size, chunk or window would make the ring divide by
  // zero or never move a byte: refuse them, naming the option.
  auto refuse = [](const char* what, const char* want) {
    std::cerr << "bad value in " << what << ": expected " << want << "\n";
    std::exit(2);
  };
  if (o.sizes_mb.empty() || *std::min_element(o.sizes_mb.begin(), o.sizes_mb.end()) <= 0)
    refuse("--sizes-mb", "sizes > 0");
  if (o.iters < 1) refuse("--iters", "an integer >= 1");
  if (o.chunk_kb < 1) refuse("--chunk-kb", "an integer >= 1");
  if (o.window < 1) refuse("--window", "an integer >= 1");
  if (o.reads < 0) refuse("--reads", "an integer >= 0");
  if (o.threads < 0) refuse("--threads", "an integer >= 0");
  if (o.heartbeat_ms < 0) refuse("--heartbeat-ms", "an integer >= 0");
  return o;
}

struct bench_config : net_system_config {
  bench_config(int64_t reads, int64_t workers, int64_t threads, int64_t heartbeat_ms)
      : net_system_config(std::chrono::milliseconds(heartbeat_ms)) {
    if (reads > 0) set("middleman.max-consecutive-reads", static_cast<size_t>(reads));
    if (workers >= 0) set("middleman.workers", static_cast<size_t>(workers));
    if (threads > 0) set("scheduler.max-threads", static_cast<size_t>(threads));
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<tensor> make_input(int64_t bytes, float v) {
  tensor t(shape_t{bytes / static_cast<int64_t>(sizeof(float))});
  t.fill(v);
  return {t};
}

// Both ranks run the same loop; the ring pairs their collectives up.
int run_rank(caf::actor_system& sys, const ring_node_actor& node, const options& o, int rank,
             bool report) {
  for (auto mb : o.sizes_mb) {
    int64_t bytes = mb * 1000 * 1000;
    auto data = make_input(bytes, static_cast<float>(rank + 1));
    std::vector<double> secs;
    for (int i = 0; i < o.iters + 2; ++i) {
      auto t0 = clk::now();
      auto r = ring_allreduce(sys, node, reduce_op::mean, data, std::chrono::seconds(60));
      double dt = std::chrono::duration<double>(clk::now() - t0).count();
      if (!r) {
        std::cerr << "rank " << rank << ": " << describe(r.error()) << "\n";
        return 1;
      }
      if (i >= 2) secs.push_back(dt);
    }
    if (!report) continue;
    double t = median(secs);
    double busbw = static_cast<double>(bytes) / t * 2.0 * (2 - 1) / 2;
    std::printf(
        "{\"bench\":\"remote_allreduce\",\"processes\":2,\"transport\":\"%s\",\"bytes\":%lld,"
        "\"chunk_bytes\":%lld,\"window\":%d,\"iters\":%d,\"median_ms\":%.3f,\"min_ms\":%.3f,"
        "\"busbw_gbps\":%.3f}\n",
        !o.gate ? "caf" : (o.tls ? "gate+tls13" : "gate+plaintext"), static_cast<long long>(bytes),
        static_cast<long long>(o.chunk_kb * 1024), o.window, o.iters, t * 1e3,
        *std::min_element(secs.begin(), secs.end()) * 1e3, busbw / 1e9);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  bench_config cfg{o.reads, o.workers, o.threads, o.heartbeat_ms};
  caf::actor_system sys{cfg};
  ring_options ro;
  ro.chunk_bytes = o.chunk_kb * 1024;
  ro.window = o.window;
  ro.on_middleman_thread = o.mm_thread;
  auto node = spawn_ring_node(sys, ro);
  // --gate: both ranks listen through a gate and connect through it, with a
  // secret rank 0 makes up and hands to rank 1 in its environment.
  std::unique_ptr<gate> door;
  ring_connector connect;
  caf::expected<uint16_t> port = uint16_t{0};
  if (o.gate) {
    if (o.peer_port < 0) ::setenv("TROUPE_BENCH_SECRET", make_challenge().c_str(), 1);
    gate_options g;
    g.secret = std::getenv("TROUPE_BENCH_SECRET");
    g.name = o.peer_port < 0 ? "rank:0" : "rank:1";
    if (!o.tls) g.link.kind = link_security::trust::insecure;
    door = open_gate(sys, node, "127.0.0.1", 0, g);
    port = door->port();
    connect = [&sys, g](const std::string& host, uint16_t p,
                        caf::timespan t) -> caf::expected<ring_peer_actor> {
      auto h = gate_remote_actor<ring_node_actor>(sys, host, p, g, t);
      if (!h) return std::move(h.error());
      return ring_peer_actor{*h};
    };
  } else {
    port = publish_ring_node(sys, node, 0);
    connect = [&sys](const std::string& host, uint16_t p, caf::timespan t) {
      return connect_ring_peer(sys, host, p, t);
    };
  }
  // Rank 1 connects to rank 0: the time that takes, gate or not (on stderr,
  // as rank 1's stdout is read by rank 0).
  connect = [inner = connect, gated = o.gate](const std::string& host, uint16_t p,
                                              caf::timespan t) {
    auto t0 = clk::now();
    auto h = inner(host, p, t);
    std::fprintf(stderr, "{\"bench\":\"remote_allreduce_connect\",\"gate\":%s,\"ms\":%.3f}\n",
                 gated ? "true" : "false",
                 std::chrono::duration<double, std::milli>(clk::now() - t0).count());
    return h;
  };
  if (!port) {
    std::cerr << "publish: " << sys.render(port.error()) << "\n";
    return 1;
  }
  int rc = 0;
  if (o.peer_port >= 0) {  // rank 1: tell rank 0 our port, then run
    std::cout << "PORT " << *port << std::endl;
    auto p0 = static_cast<uint16_t>(o.peer_port);
    if (auto err = join_ring(sys, node, 1, {{"127.0.0.1", p0}, {"127.0.0.1", *port}},
                             std::chrono::seconds(10), connect)) {
      std::cerr << "rank 1 join: " << describe(err) << "\n";
      rc = 1;
    } else {
      rc = run_rank(sys, node, o, 1, false);
    }
    // Stay until rank 0 is done (it closes our stdin): rank 0's last
    // collective ends only when this rank's acknowledgement of its last chunk
    // arrived, which a process exiting at once may not have sent yet.
    for (std::string line; std::getline(std::cin, line);) {
    }
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    return rc;
  }
  // rank 0: start rank 1 with the same options, read its port from a pipe.
  int out_p[2];
  int in_p[2];
  if (pipe(out_p) != 0 || pipe(in_p) != 0) return 1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_p[1], 1);
  posix_spawn_file_actions_addclose(&fa, out_p[0]);
  posix_spawn_file_actions_adddup2(&fa, in_p[0], 0);
  posix_spawn_file_actions_addclose(&fa, in_p[1]);
  std::vector<std::string> args = {"/proc/self/exe", "--peer=" + std::to_string(*port)};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  int src = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out_p[1]);
  close(in_p[0]);
  if (src != 0) {
    std::cerr << "posix_spawn failed\n";
    return 1;
  }
  FILE* child_out = fdopen(out_p[0], "r");
  char line[128] = {0};
  unsigned p1 = 0;
  if (!std::fgets(line, sizeof line, child_out) || std::sscanf(line, "PORT %u", &p1) != 1) {
    std::cerr << "rank 1 did not report its port\n";
    rc = 1;
  } else if (auto err = join_ring(sys, node, 0,
                                  {{"127.0.0.1", *port}, {"127.0.0.1", static_cast<uint16_t>(p1)}},
                                  std::chrono::seconds(10), connect)) {
    std::cerr << "rank 0 join: " << describe(err) << "\n";
    rc = 1;
  } else {
    rc = run_rank(sys, node, o, 0, true);
  }
  if (rc != 0) kill(pid, SIGKILL);
  close(in_p[1]);  // rank 1 may go
  int st = 0;
  waitpid(pid, &st, 0);
  std::fclose(child_out);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    if (WIFSIGNALED(st))
      std::cerr << "rank 1 died of signal " << WTERMSIG(st) << "\n";
    else if (WIFEXITED(st))
      std::cerr << "rank 1 exited with " << WEXITSTATUS(st) << "\n";
    rc = rc ? rc : 1;
  }
  return rc;
}
