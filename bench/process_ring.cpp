// bench_process_ring: the all-reduce of two processes over process_ring
// (runtime/process_ring.hpp), the link mirrored across processes uses for
// the process's sum: sockets of its own, driven by the calling thread.
//
//   bench_process_ring [--sizes-kb=1056,16384] [--iters=200] [--tls=1]
//                      [--same-host=tcp|unix|shm] [--unix=0|1]
//
// --same-host: the links the job makes between processes of one host
// (strategy.reducer.same_host): "shm" a shared ring handed over a Unix
// socket, "unix" the Unix socket itself (plain bytes; --unix=1 says the
// same), "tcp" (the default here) TCP on 127.0.0.1, as between hosts.
//
// The process forks rank 1; the two exchange their link offers over pipes
// (in a job they travel between the ring nodes), connect, and run 5 warm-up
// and `iters` timed all-reduces of each size. Rank 0 prints one JSON line
// per size: median and min latency, busbw = bytes / time (P = 2).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "runtime/process_ring.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::vector<std::size_t> sizes_kb{1056, 16384};
  int iters = 200;
  bool tls = true;
  same_host_link same_host = same_host_link::tcp;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_process_ring: %s\nusage: bench_process_ring [--sizes-kb=1056,16384] "
               "[--iters=200] [--tls=0|1] [--same-host=tcp|unix|shm] [--unix=0|1]\n",
               why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    try {
      if (a.rfind("--sizes-kb=", 0) == 0) {
        o.sizes_kb.clear();
        std::stringstream ss(a.substr(11));
        for (std::string x; std::getline(ss, x, ',');) {
          long v = std::stol(x);
          if (v <= 0) usage(a + ": sizes must be > 0");
          o.sizes_kb.push_back(static_cast<std::size_t>(v));
        }
      } else if (a.rfind("--iters=", 0) == 0) {
        o.iters = std::stoi(a.substr(8));
        if (o.iters <= 0) usage(a + ": expected > 0");
      } else if (a.rfind("--tls=", 0) == 0) {
        o.tls = std::stoi(a.substr(6)) != 0;
      } else if (a.rfind("--unix=", 0) == 0) {
        o.same_host =
            std::stoi(a.substr(7)) != 0 ? same_host_link::unix_socket : same_host_link::tcp;
      } else if (a.rfind("--same-host=", 0) == 0) {
        const std::string v = a.substr(12);
        if (v != "tcp" && v != "unix" && v != "shm") usage(a + ": expected tcp, unix or shm");
        o.same_host = v == "shm"    ? same_host_link::shared_memory
                      : v == "unix" ? same_host_link::unix_socket
                                    : same_host_link::tcp;
      } else {
        usage("unknown argument " + a);
      }
    } catch (const std::logic_error&) {
      usage(a + ": not a number");
    }
  }
  return o;
}

void write_offer(int fd, const ring_link_offer& o) {
  std::string line = std::to_string(o.port) + " ";
  for (unsigned char c : o.key) {
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", c);
    line += hex;
  }
  line += "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::exit(3);
}

ring_link_offer read_offer(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  ring_link_offer o;
  o.host = "127.0.0.1";
  auto sp = line.find(' ');
  if (sp == std::string::npos) std::exit(3);
  o.port = static_cast<uint16_t>(std::stoi(line.substr(0, sp)));
  for (std::size_t i = sp + 1; i + 1 < line.size(); i += 2)
    o.key.push_back(static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16)));
  return o;
}

const char* transport(const std::string& link, bool tls) {
  if (link.rfind("shared", 0) == 0) return "shm";
  if (link.rfind("Unix", 0) == 0) return "unix";
  return tls ? "tls13" : "plaintext";
}

// Rank `rank` of 2: listens, trades offers with the other over the pipes,
// connects, and runs the sizes.
int run_rank(int rank, int to_other, int from_other, const options& o) {
  ring_link_listener listener("127.0.0.1", o.same_host);
  write_offer(to_other, listener.offer());
  auto theirs = read_offer(from_other);
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  const std::string other = rank == 0 ? "rank 1" : "rank 0";
  auto accepted =
      std::async(std::launch::async, [&] { return listener.accept(deadline, other, o.tls); });
  auto to_next = connect_ring_link(theirs, deadline, other, o.tls, o.same_host);
  process_ring ring(rank, 2, std::move(to_next), accepted.get());
  for (std::size_t kb : o.sizes_kb) {
    std::vector<float> x(kb * 1024 / sizeof(float), 1.0f);
    std::vector<double> ms;
    for (int i = 0; i < 5 + o.iters; ++i) {
      const auto t0 = clock_type::now();
      ring.all_reduce(x.data(), x.size(), reduce_op::mean);
      const double t = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
      if (i >= 5) ms.push_back(t);
    }
    if (rank != 0) continue;
    const double med = bench::median(ms);
    const double mn = *std::min_element(ms.begin(), ms.end());
    const double bytes = static_cast<double>(x.size() * sizeof(float));
    std::printf(
        "{\"bench\":\"process_ring\",\"processes\":2,\"transport\":\"%s\",\"bytes\":%.0f,"
        "\"iters\":%d,\"median_ms\":%.4f,\"min_ms\":%.4f,\"busbw_gbps\":%.3f}\n",
        transport(ring.next_link(), o.tls), bytes, o.iters, med, mn, bytes / (med * 1e-3) / 1e9);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  int a[2], b[2];
  if (::pipe(a) != 0 || ::pipe(b) != 0) return 3;
  pid_t child = ::fork();
  if (child < 0) return 3;
  try {
    if (child == 0) {
      int rc = run_rank(1, b[1], a[0], o);
      std::_Exit(rc);
    }
    int rc = run_rank(0, a[1], b[0], o);
    int status = 0;
    ::waitpid(child, &status, 0);
    return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_process_ring: %s\n", e.what());
    return 1;
  }
}
