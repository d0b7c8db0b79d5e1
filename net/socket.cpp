// The socket module (net/socket.hpp).
#include "net/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <limits>

namespace troupe::net {

// ------------------------------------------------------------------ listening

namespace {

// A listening socket on one resolved address; -1 with `why` set.
int listen_at(const addrinfo& a, int backlog, std::string& why) {
  const int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) {
    why = std::strerror(errno);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, a.ai_addr, a.ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
    why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  return fd;
}

}  // namespace

int listen_tcp(const std::string& host, uint16_t port, int backlog, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                               &hints, &res);
  if (rc != 0) {
    why = ::gai_strerror(rc);
    return -1;
  }
  why = "no address";
  int fd = -1;
  for (auto* a = res; a != nullptr && fd < 0; a = a->ai_next) fd = listen_at(*a, backlog, why);
  ::freeaddrinfo(res);
  return fd;
}

namespace {

// `fd`, non-blocking, connected to `a` by `deadline`: 0, else the errno.
int connect_by(int fd, const addrinfo& a, clock_type::time_point deadline) {
  if (::connect(fd, a.ai_addr, a.ai_addrlen) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  int soerr = ETIMEDOUT;
  if (wait_ready(fd, POLLOUT, deadline)) {
    socklen_t len = sizeof soerr;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
  }
  return soerr;
}

}  // namespace

int connect_tcp(const std::string& host, uint16_t port, clock_type::time_point deadline,
                std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    why = "cannot resolve " + host + ": " + ::gai_strerror(rc);
    return -1;
  }
  const auto where = host + ":" + std::to_string(port);
  why = "cannot connect to " + where;
  int fd = -1;
  for (auto* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (const int e = connect_by(fd, *a, deadline); e != 0) {
      why = "cannot connect to " + where + ": " + std::strerror(e);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

namespace {

// The address of an abstract Unix socket name (its leading NUL included).
sockaddr_un unix_address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof(a.sun_path));
  std::memcpy(a.sun_path, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
  return a;
}

}  // namespace

int listen_unix(const std::string& name, int backlog, std::string& why) {
  socklen_t len = 0;
  const sockaddr_un a = unix_address(name, &len);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 ||
      ::listen(fd, backlog) != 0) {
    why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

int connect_unix(const std::string& name, std::string& why) {
  socklen_t len = 0;
  const sockaddr_un a = unix_address(name, &len);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool peer_runs_as_us(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid();
}

bool numeric_address(const std::string& host) {
  in6_addr any{};
  return ::inet_pton(AF_INET, host.c_str(), &any) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &any) == 1;
}

uint16_t local_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  return 0;
}

std::string peer_of(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::string host_of(const std::string& peer) {
  const auto colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

// ------------------------------------------------------------ blocking I/O

int poll_timeout(clock_type::time_point deadline) {
  if (deadline == kNoDeadline) return -1;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

bool wait_ready(int fd, short events, clock_type::time_point deadline, int stop_fd) {
  for (;;) {
    const int ms = poll_timeout(deadline);
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int r = ::poll(fds, stop_fd >= 0 ? 2 : 1, ms);
    if (r < 0 && errno == EINTR) continue;
    // A poll that fails counts as ready: the caller's send or recv says why.
    if (r < 0) return true;
    if (stop_fd >= 0 && fds[1].revents != 0) return false;
    if (r > 0) return true;
    if (ms == 0) return false;  // the deadline passed (a last look was taken)
  }
}

bool send_all(int fd, std::string_view data, clock_type::time_point deadline, int stop_fd) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline, stop_fd)) return false;
      continue;
    }
    return false;
  }
  return true;
}

bool recv_exact(int fd, std::string& out, clock_type::time_point deadline, std::string* why) {
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::recv(fd, out.data() + got, out.size() - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      *why = "closed the connection during the handshake";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *why = std::strerror(errno);
      return false;
    }
    if (!wait_ready(fd, POLLIN, deadline)) {
      *why = "no answer within the handshake timeout";
      return false;
    }
  }
  return true;
}

// ------------------------------------------------------ descriptor passing

bool send_with_fd(int sock, std::string_view data, int fd, clock_type::time_point deadline) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n > 0) return send_all(sock, data.substr(static_cast<std::size_t>(n)), deadline);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_ready(sock, POLLOUT, deadline))
      continue;
    return false;
  }
}

namespace {

// Takes the descriptors a message brought: the first into `*fd` while it is
// empty, every other closed; false if there was one too many.
bool take_descriptors(msghdr& msg, int* fd) {
  bool ok = true;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd < 0 && ok) {
        *fd = got;
      } else {
        ::close(got);
        ok = false;
      }
    }
  }
  return ok && (msg.msg_flags & MSG_CTRUNC) == 0;
}

}  // namespace

bool recv_with_fd(int sock, std::string& out, int* fd, clock_type::time_point deadline) {
  *fd = -1;
  std::size_t got = 0;
  bool ok = true;
  while (ok && got < out.size()) {
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    iovec iov{out.data() + got, out.size() - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      ok = take_descriptors(msg, fd);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      ok = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_ready(sock, POLLIN, deadline);
    }
  }
  if (!ok && *fd >= 0) {
    ::close(*fd);
    *fd = -1;
  }
  return ok;
}

// ----------------------------------------------------------------- reactor

reactor::reactor() {
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    problem_ = std::string("pipe: ") + std::strerror(errno);
    pipe_[0] = pipe_[1] = -1;
  }
  fds_.push_back({pipe_[0], POLLIN, 0});
}

reactor::~reactor() {
  for (int fd : pipe_)
    if (fd >= 0) ::close(fd);
}

void reactor::wake() {
  const char byte = 1;
  [[maybe_unused]] auto n = ::write(pipe_[1], &byte, 1);
}

std::size_t reactor::watch(int fd, short events) {
  fds_.push_back({fd, events, 0});
  return fds_.size() - 2;
}

int reactor::wait(int timeout_ms) {
  for (auto& p : fds_) p.revents = 0;
  const int n = ::poll(fds_.data(), fds_.size(), timeout_ms);
  if (n > 0 && fds_[0].revents != 0) {
    char drain[64];
    while (::read(pipe_[0], drain, sizeof drain) > 0) {
    }
  }
  return n;
}

}  // namespace troupe::net
