#pragma once
// A TCP port on 127.0.0.1 that nobody uses now, for a test that must name a
// port before the process that listens on it starts. Taken below the
// kernel's ephemeral range (net.ipv4.ip_local_port_range), where neither a
// bind to port 0 nor an outgoing connection's local port ever lands: a port
// the kernel picked for bind(0), closed again, can be handed to another
// test's connection before ours listens on it ("Address already in use"
// with tests running side by side). At random in the 12000 ports below the
// range, never the same twice in one process, and checked bindable.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <mutex>
#include <random>
#include <set>

namespace troupe::test {

// Binds a socket to 127.0.0.1:port (0: the kernel's choice) and closes it
// again; the port it got, or 0 if the bind failed.
inline uint16_t bind_probe(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

inline uint16_t free_port() {
  static std::mutex m;
  static std::set<uint16_t> given;
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  std::lock_guard lock(m);
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  if (low > 13000) {
    std::uniform_int_distribution<int> pick(low - 12000, low - 1);
    for (int tries = 0; tries < 500; ++tries) {
      const auto p = static_cast<uint16_t>(pick(rng));
      if (!given.count(p) && bind_probe(p) == p) {
        given.insert(p);
        return p;
      }
    }
  }
  // No room below the range: the kernel's choice.
  const uint16_t p = bind_probe(0);
  REQUIRE(p != 0);
  return p;
}

}  // namespace troupe::test
