// Setting the process ring's links up (runtime/process_ring.hpp): the
// listener that challenges each newcomer for the proof of the key, the
// connecting side, and the keys and names derived for them. The collectives
// over the links: runtime/process_ring.cpp.
#include "runtime/process_ring.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
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
using namespace std::chrono_literals;

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
  if (same_host && !net::peer_runs_as_us(c)) {
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

// Sends the shared ring's memfd to the admitted peer on `fd`, then closes
// it here (the peer's copy and the two mappings are all there is); false
// if the socket failed.
bool offer_shared_ring(int fd, ring_shm& shm, clock_type::time_point deadline) {
  std::string offer(kShmTag);
  const uint64_t capacity = shm.capacity();
  offer.append(reinterpret_cast<const char*>(&capacity), sizeof(capacity));
  if (!net::send_with_fd(fd, offer, shm.memfd(), deadline)) return false;
  shm.close_memfd();
  return true;
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

ring_link_listener::ring_link_listener(const std::string& bind_host, same_host_link same_host) {
  // Made before anyone may connect, so a host without memfds fails here; it
  // goes only to a connection on the Unix socket that proves the key.
  if (same_host == same_host_link::shared_memory) shm_ = ring_shm::create();
  std::string why;
  fd_ = net::listen_tcp(bind_host, 0, 16, why);
  if (fd_ < 0) throw device_error("process ring: cannot listen on " + bind_host + ": " + why);
  offer_.host = bind_host;
  offer_.port = net::local_port(fd_);
  offer_.key = crypto::random_bytes(32);
  if (same_host != same_host_link::tcp) listen_on_unix_name();
}

// Bound before the offer leaves this process, so no one can take the name.
void ring_link_listener::listen_on_unix_name() {
  std::string why;
  unix_fd_ = net::listen_unix(ring_link_unix_name(offer_.key), 16, why);
  if (unix_fd_ < 0) {
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
      if (u.same_host && shm_) {
        if (!offer_shared_ring(u.fd, *shm_, deadline)) {
          drop(i, "did not take the shared buffer");
          continue;
        }
        s.shm = std::move(shm_);
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

// A connected socket on the offer's Unix name, or -1 where this network
// namespace has none (another host) or another user holds it.
int try_connect_unix(const ring_link_offer& offer) {
  std::string why;
  const int fd = net::connect_unix(ring_link_unix_name(offer.key), why);
  if (fd < 0) return -1;
  if (!net::peer_runs_as_us(fd)) {
    spdlog::warn("process ring: the Unix socket of {}:{} is held by another user; using TCP",
                 offer.host, offer.port);
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

ring_socket connect_ring_link(const ring_link_offer& offer, clock_type::time_point deadline,
                              const std::string& peer, bool encrypted, same_host_link how) {
  const std::string where = peer + " at " + offer.host + ":" + std::to_string(offer.port);
  int fd = how != same_host_link::tcp ? try_connect_unix(offer) : -1;
  const bool same_host = fd >= 0;
  std::string why;
  // A refused connection is retried: the listener may not listen yet.
  while (fd < 0 && (fd = net::connect_tcp(offer.host, offer.port,
                                          std::min(deadline, clock_type::now() + 1s), why)) < 0) {
    if (clock_type::now() >= deadline)
      throw device_error("process ring: cannot connect to " + where + " (" + why + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string challenge(kChallengeBytes, '\0');
  if (!net::recv_exact(fd, challenge, deadline, &why)) {
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
