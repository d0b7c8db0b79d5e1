// The yardstick for bench_remote_allreduce: the same 2-process ring
// all-reduce (mean of float32, reduce-scatter then all-gather, 1 MiB chunks)
// over plain loopback TCP sockets, without CAF. What the VM's loopback gives
// on the day, against what troupe gets through CAF's BASP.
//
//   bench_tcp_ring_reference [--sizes-mb=16] [--iters=20] [--chunk-kb=1024]
//
// Rank 0 listens on a free port of 127.0.0.1 and forks rank 1, which
// connects. Per collective each rank sends its half and receives the other's
// (a thread sends while the caller receives and combines, as a full-duplex
// ring link does), then the same for the all-gather. One JSON line per size:
// median seconds over `iters` after 2 warm-up collectives; busbw = bytes /
// time (P = 2).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

void send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    auto k = ::send(fd, p, n, 0);
    check(k > 0, "send");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    auto k = ::recv(fd, p, n, 0);
    check(k > 0, "recv");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

// One mean all-reduce of `data` with the peer on `fd` (rank 0 owns the
// first half after the reduce-scatter, rank 1 the second).
void allreduce(int fd, int rank, std::vector<float>& data, std::vector<float>& tmp,
               std::size_t chunk) {
  const std::size_t half = data.size() / 2;
  float* mine = data.data() + (rank == 0 ? 0 : half);
  float* theirs = data.data() + (rank == 0 ? half : 0);
  const std::size_t n_mine = rank == 0 ? half : data.size() - half;
  const std::size_t n_theirs = data.size() - n_mine;
  // Reduce-scatter: send the half the peer owns, combine the half this rank owns.
  std::thread tx(
      [&] { send_all(fd, reinterpret_cast<const char*>(theirs), n_theirs * sizeof(float)); });
  for (std::size_t off = 0; off < n_mine; off += chunk) {
    std::size_t len = std::min(chunk, n_mine - off);
    recv_all(fd, reinterpret_cast<char*>(tmp.data()), len * sizeof(float));
    for (std::size_t i = 0; i < len; ++i) mine[off + i] = 0.5f * (mine[off + i] + tmp[i]);
  }
  tx.join();
  // All-gather: send the reduced half, receive the peer's straight into place.
  std::thread tx2(
      [&] { send_all(fd, reinterpret_cast<const char*>(mine), n_mine * sizeof(float)); });
  recv_all(fd, reinterpret_cast<char*>(theirs), n_theirs * sizeof(float));
  tx2.join();
}

void run(int fd, int rank, const std::vector<double>& sizes_mb, int iters, std::size_t chunk) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  for (double mb : sizes_mb) {
    auto bytes = static_cast<std::size_t>(mb * 1e6);
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    std::vector<float> tmp(chunk);
    std::vector<double> times;
    for (int i = 0; i < iters + 2; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      allreduce(fd, rank, data, tmp, chunk);
      std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (i >= 2) times.push_back(dt.count());
    }
    if (rank != 0) continue;
    double s = troupe::bench::median(times);
    std::printf(
        "{\"bench\":\"tcp_ring_reference\",\"processes\":2,\"bytes\":%zu,\"chunk_bytes\":%zu,"
        "\"iters\":%d,\"median_ms\":%.3f,\"min_ms\":%.3f,\"busbw_gbps\":%.3f}\n",
        bytes, chunk * sizeof(float), iters, s * 1e3,
        *std::min_element(times.begin(), times.end()) * 1e3, static_cast<double>(bytes) / s / 1e9);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes{16};
  int iters = 20;
  std::size_t chunk_kb = 1024;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    try {
      if (a.rfind("--sizes-mb=", 0) == 0) {
        sizes.clear();
        std::stringstream ss(a.substr(11));
        for (std::string x; std::getline(ss, x, ',');) sizes.push_back(std::stod(x));
        if (sizes.empty() || *std::min_element(sizes.begin(), sizes.end()) <= 0)
          throw std::invalid_argument("sizes must be > 0");
      } else if (a.rfind("--iters=", 0) == 0) {
        iters = std::max(1, std::stoi(a.substr(8)));
      } else if (a.rfind("--chunk-kb=", 0) == 0) {
        chunk_kb = static_cast<std::size_t>(std::max(1, std::stoi(a.substr(11))));
      } else {
        std::fprintf(stderr, "unknown argument %s\n", a.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "bad value in %s: expected a positive number (or list of them)\n",
                   a.c_str());
      return 2;
    }
  }
  const std::size_t chunk = chunk_kb * 1024 / sizeof(float);
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  check(lfd >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "bind");
  check(::listen(lfd, 1) == 0, "listen");
  socklen_t len = sizeof addr;
  check(::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname");
  pid_t child = ::fork();
  check(child >= 0, "fork");
  if (child == 0) {
    ::close(lfd);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    check(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect");
    run(fd, 1, sizes, iters, chunk);
    ::close(fd);
    std::_Exit(0);
  }
  int fd = ::accept(lfd, nullptr, nullptr);
  check(fd >= 0, "accept");
  run(fd, 0, sizes, iters, chunk);
  ::close(fd);
  ::close(lfd);
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
