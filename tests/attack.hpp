#pragma once
// What an attacker on the network does, for the gate's tests (test_gate,
// test_nodes): raw connections, BASP headers as CAF 0.17 writes them, and
// reading whatever comes back.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace troupe::attack {

inline int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Whether something accepts connections on `port` within `limit`.
inline bool wait_listening(uint16_t port, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    ::usleep(20000);
  }
}

// Everything the other end sends until it closes (or `limit` passes).
inline std::string drain(int fd, std::chrono::milliseconds limit) {
  std::string out;
  auto end = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// A BASP header as CAF 0.17 writes it (big-endian): operation, two padding
// bytes, flags, payload_len, operation_data, source and destination actor.
inline std::string basp_header(uint8_t op, uint8_t flags, uint32_t payload_len) {
  std::string h(32, '\0');
  h[0] = static_cast<char>(op);
  h[3] = static_cast<char>(flags);
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<char>((payload_len >> (24 - 8 * i)) & 0xff);
  return h;
}

// Opens the connections of the attack on `port` and leaves them
// open: `headers` announcing a 4 GiB payload, then `random` connections of
// up to 4 KiB of random bytes. The caller closes the returned descriptors.
inline std::vector<int> flood(uint16_t port, int headers, int random, unsigned seed = 7) {
  std::vector<int> fds;
  for (int i = 0; i < headers; ++i) {
    int fd = raw_connect(port);
    auto h = basp_header(2, 0, 0xffffffffu);
    CHECK(::send(fd, h.data(), h.size(), MSG_NOSIGNAL) == 32);
    fds.push_back(fd);
  }
  std::mt19937 rng(seed);
  for (int i = 0; i < random; ++i) {
    int fd = raw_connect(port);
    std::string junk(static_cast<std::size_t>(rng() % 4096 + 1), '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  return fds;
}

// The forged BASP client_handshake (operation 1) with select_connection_flag
// that took over a worker's routes before the gate; returns what the
// listener sent back.
inline std::string forged_handshake(uint16_t port) {
  int fd = raw_connect(port);
  auto forged = basp_header(1, 0x02, 64) + std::string(64, 'x') + std::string(200, 'y');
  CHECK(::send(fd, forged.data(), forged.size(), MSG_NOSIGNAL) > 0);
  auto got = drain(fd, std::chrono::seconds(3));
  ::close(fd);
  return got;
}

// True when the other end closed the connection within `limit`.
inline bool closed_within(int fd, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

// This process's resident memory, in MB.
inline long rss_mb() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE) / (1024 * 1024);
}

// Whether `p` holds within `limit` (polled every 10 ms).
template <class Pred>
bool eventually(Pred p, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace troupe::attack
