// Setting the process ring's links up (runtime/process_ring.hpp): the
// listener that challenges each newcomer for the proof of the key, the
// connecting side, and the keys and names derived for them. The collectives
// over the links: runtime/process_ring.cpp.
#include "runtime/process_ring.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "actors/reducers/collective.hpp"
#include "crypto/crypto.hpp"
#include "net/socket.hpp"
#include "runtime/ring_detail.hpp"
#include "runtime/ring_shm.hpp"

namespace troupe {

using namespace ring_detail;

namespace {

constexpr std::size_t kChallengeBytes = 32;
constexpr auto kProofTimeout = std::chrono::seconds(5);
constexpr std::size_t kMaxUnproven = 16;
// What the listener sends, with the ring's memfd attached, after a same-host
// connection proved the key: this tag and the ring's capacity (8 bytes,
// this host's byte order).
constexpr std::string_view kShmTag = "troupe-ring-shm1";
constexpr std::size_t kShmOfferBytes = 16 + 8;

}  // namespace

std::string ring_link_proof(const std::string& key, const std::string& challenge) {
  return crypto::as_string(crypto::hmac_sha256(key, "troupe process_ring v1 proof:" + challenge));
}

std::string ring_link_secret(const std::string& key, const std::string& challenge) {
  return crypto::hkdf(challenge, key, "troupe process_ring v1 traffic", 32);
}

std::string ring_link_unix_name(const std::string& key) {
  const std::string tag =
      crypto::as_string(crypto::hmac_sha256(key, "troupe process_ring v1 unix name"));
  return std::string(1, '\0') + "troupe-ring-" + crypto::to_hex(tag.substr(0, 16));
}

namespace {

addrinfo* resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw device_error("process ring: cannot resolve \"" + host + "\": " + ::gai_strerror(rc));
  return res;
}

uint16_t bound_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw device_error("process ring: " + errno_text("getsockname"));
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

// The address of an abstract Unix socket name (its leading NUL included).
sockaddr_un unix_address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), std::min(name.size(), sizeof(a.sun_path)));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  return a;
}

// Whether the process at the other end of Unix socket `fd` runs as we do.
bool peer_runs_as_us(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid();
}

// A connection that has been sent its challenge and owes the proof.
struct unproven {
  int fd = -1;
  std::string challenge;
  std::string answer;
  clock_type::time_point until;
  bool same_host = false;  // came in on the Unix socket
};

// Reads what `u` sent of its answer; true once it is whole.
bool read_answer(unproven& u) {
  char buf[kChallengeBytes];
  ssize_t k = ::recv(u.fd, buf, kChallengeBytes - u.answer.size(), 0);
  if (k > 0) u.answer.append(buf, static_cast<std::size_t>(k));
  if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    u.until = clock_type::time_point::min();  // gone: dropped below
  return u.answer.size() == kChallengeBytes;
}

// Accepts one connection on `listening` and sends it a challenge.
void challenge_newcomer(int listening, bool same_host, const ring_link_offer& offer,
                        std::vector<unproven>& waiting) {
  int c = ::accept4(listening, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (c < 0) return;
  if (same_host && !peer_runs_as_us(c)) {
    spdlog::warn(
        "process ring: a process of another user connected to the Unix socket of {}:{}; "
        "closed",
        offer.host, offer.port);
    ::close(c);
    return;
  }
  unproven u{
      c, crypto::random_bytes(kChallengeBytes), {}, clock_type::now() + kProofTimeout, same_host};
  // 32 bytes into a fresh socket's empty buffer: sent whole or not at all.
  if (::send(c, u.challenge.data(), kChallengeBytes, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(kChallengeBytes)) {
    ::close(c);
    return;
  }
  waiting.push_back(std::move(u));
}

// A fresh shared ring, its memfd sent to the admitted peer on `fd` (then
// closed here: the peer's copy and the two mappings are all there is);
// null if the socket failed.
std::shared_ptr<ring_shm> offer_shared_ring(int fd, clock_type::time_point deadline) {
  auto shm = ring_shm::create();
  std::string offer(kShmTag);
  const uint64_t capacity = shm->capacity();
  offer.append(reinterpret_cast<const char*>(&capacity), sizeof(capacity));
  const bool sent = net::send_with_fd(fd, offer, shm->memfd(), deadline);
  shm->close_memfd();
  return sent ? shm : nullptr;
}

// The shared ring the listener offers on `fd` once the proof is sent.
std::shared_ptr<ring_shm> take_shared_ring(int fd, clock_type::time_point deadline,
                                           const std::string& where) {
  std::string offer(kShmOfferBytes, '\0');
  int memfd = -1;
  if (!net::recv_with_fd(fd, offer, &memfd, deadline) || memfd < 0 ||
      offer.compare(0, kShmTag.size(), kShmTag) != 0) {
    if (memfd >= 0) ::close(memfd);
    throw device_error("process ring: " + where +
                       " offered no shared buffer (same_host \"shm\" on both ends?)");
  }
  uint64_t capacity = 0;
  std::memcpy(&capacity, offer.data() + kShmTag.size(), sizeof(capacity));
  return ring_shm::adopt(memfd, static_cast<std::size_t>(capacity));
}

}  // namespace

ring_link_listener::ring_link_listener(const std::string& bind_host, same_host_link same_host)
    : same_host_(same_host) {
  addrinfo* res = resolve(bind_host, 0, true);
  std::string why;
  for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      fd_ = fd;
    } else {
      why = errno_text("bind");
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) throw device_error("process ring: cannot listen on " + bind_host + ": " + why);
  offer_.host = bind_host;
  offer_.port = bound_port(fd_);
  offer_.key = crypto::random_bytes(32);
  if (same_host != same_host_link::tcp) listen_on_unix_name();
}

// Bound before the offer leaves this process, so no one can take the name.
void ring_link_listener::listen_on_unix_name() {
  socklen_t len = 0;
  const sockaddr_un a = unix_address(ring_link_unix_name(offer_.key), &len);
  unix_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (unix_fd_ < 0 || ::bind(unix_fd_, reinterpret_cast<const sockaddr*>(&a), len) != 0 ||
      ::listen(unix_fd_, 16) != 0) {
    const std::string why = errno_text("bind");
    close_listeners();
    throw device_error("process ring: cannot listen on a Unix socket: " + why);
  }
}

void ring_link_listener::close_listeners() {
  for (int* fd : {&fd_, &unix_fd_})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
}

ring_link_listener::~ring_link_listener() {
  close_listeners();
}

ring_socket ring_link_listener::accept(clock_type::time_point deadline, const std::string& peer,
                                       bool encrypted) {
  std::vector<unproven> waiting;
  auto drop = [&](std::size_t i, const char* why) {
    spdlog::warn("process ring: a connection to {}:{} (waiting for {}) {}; closed", offer_.host,
                 offer_.port, peer, why);
    ::close(waiting[i].fd);
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
  };
  for (;;) {
    const auto now = clock_type::now();
    if (now >= deadline) {
      for (auto& u : waiting) ::close(u.fd);
      throw device_error("process ring: " + peer + " did not connect to " + offer_.host + ":" +
                         std::to_string(offer_.port) + " in time");
    }
    for (std::size_t i = waiting.size(); i-- > 0;)
      if (waiting[i].until <= now) drop(i, "did not prove the link key in time");
    const short room = waiting.size() < kMaxUnproven ? POLLIN : 0;
    std::vector<pollfd> fds{{fd_, room, 0}, {unix_fd_, room, 0}};  // poll skips -1
    for (auto& u : waiting) fds.push_back({u.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), std::min(ms_until(deadline), 100));
    for (std::size_t i = waiting.size(); i-- > 0;) {
      if (!(fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (!read_answer(waiting[i])) continue;
      if (!crypto::constant_time_equal(waiting[i].answer,
                                       ring_link_proof(offer_.key, waiting[i].challenge))) {
        drop(i, "answered its challenge wrongly");
        continue;
      }
      const unproven& u = waiting[i];
      ring_socket s{
          u.fd,
          encrypted && !u.same_host ? ring_link_secret(offer_.key, u.challenge) : std::string(),
          peer, u.same_host, nullptr};
      if (u.same_host && same_host_ == same_host_link::shared_memory &&
          !(s.shm = offer_shared_ring(u.fd, deadline))) {
        drop(i, "did not take the shared buffer");
        continue;
      }
      waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
      for (auto& w : waiting) ::close(w.fd);
      close_listeners();
      return s;
    }
    for (int k : {0, 1})
      if (fds[k].revents & POLLIN) challenge_newcomer(fds[k].fd, k == 1, offer_, waiting);
  }
}

namespace {

// A connected non-blocking socket to host:port, or -1 while it is refused.
int try_connect(const ring_link_offer& offer, clock_type::time_point deadline) {
  addrinfo* res = resolve(offer.host, offer.port, false);
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    throw device_error("process ring: " + errno_text("socket"));
  }
  int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, std::min(ms_until(deadline), 1000));
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = (p.revents & POLLOUT) && err == 0 ? 0 : -1;
  }
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A connected socket on the offer's Unix name, or -1 where this network
// namespace has none (another host) or another user holds it.
int try_connect_unix(const ring_link_offer& offer) {
  socklen_t len = 0;
  const sockaddr_un a = unix_address(ring_link_unix_name(offer.key), &len);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    ::close(fd);
    return -1;
  }
  if (!peer_runs_as_us(fd)) {
    spdlog::warn("process ring: the Unix socket of {}:{} is held by another user; using TCP",
                 offer.host, offer.port);
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads exactly n bytes by the deadline; false if the peer closed or is late.
bool read_exactly(int fd, char* out, std::size_t n, clock_type::time_point deadline) {
  std::size_t got = 0;
  while (got < n) {
    ssize_t k = ::recv(fd, out + got, n - got, 0);
    if (k > 0) {
      got += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (clock_type::now() >= deadline) return false;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, std::min(ms_until(deadline), 1000));
  }
  return true;
}

}  // namespace

ring_socket connect_ring_link(const ring_link_offer& offer, clock_type::time_point deadline,
                              const std::string& peer, bool encrypted, same_host_link how) {
  const std::string where = peer + " at " + offer.host + ":" + std::to_string(offer.port);
  int fd = how != same_host_link::tcp ? try_connect_unix(offer) : -1;
  const bool same_host = fd >= 0;
  while (fd < 0 && (fd = try_connect(offer, deadline)) < 0) {
    if (clock_type::now() >= deadline)
      throw device_error("process ring: cannot connect to " + where);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string challenge(kChallengeBytes, '\0');
  if (!read_exactly(fd, challenge.data(), kChallengeBytes, deadline)) {
    ::close(fd);
    throw device_error("process ring: " + where + " sent no challenge");
  }
  const std::string proof = ring_link_proof(offer.key, challenge);
  if (::send(fd, proof.data(), proof.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(proof.size())) {
    ::close(fd);
    throw device_error("process ring: sending the proof to " + where + ": " + errno_text("send"));
  }
  ring_socket s{fd,
                encrypted && !same_host ? ring_link_secret(offer.key, challenge) : std::string(),
                peer, same_host, nullptr};
  if (same_host && how == same_host_link::shared_memory) {
    try {
      s.shm = take_shared_ring(fd, deadline, where);
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
  return s;
}

}  // namespace troupe
