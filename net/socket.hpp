#pragma once
// The one socket module of troupe's own listeners: the gate
// (net/gate.hpp), the TLS links' hub and pumps (net/secure_link.hpp), the
// rendezvous (net/rendezvous.hpp), monitoring's /metrics exporter and the
// process ring's direct links (runtime/process_ring.hpp).
//
//   listen_tcp,   a non-blocking listening or connected socket for
//   connect_tcp   host:port, every address the name resolves to tried in turn;
//   send_all,     blocking I/O with a deadline on a non-blocking socket,
//   recv_exact    waiting in poll() while the socket is not ready;
//   listen_unix,  the same for an abstract Unix socket name (Linux), and
//   connect_unix, whether its peer runs under our uid (SO_PEERCRED);
//   peer_runs_as_us
//   send_with_fd, a small message with a descriptor attached (SCM_RIGHTS)
//   recv_with_fd  on a Unix socket;
//   reactor       the loop of a thread that serves sockets: one poll() over
//                 the caller's descriptors plus a wake pipe, which another
//                 thread writes to stop it or hand it work.
//
// Why one module: each of those had its own copy of the loop and of the
// send and bind code, with the same corner cases (EINTR, a deadline already
// past, a pipe that must not block its writer) handled one by one.
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::net {

using clock_type = std::chrono::steady_clock;

// No deadline: wait as long as it takes.
inline constexpr clock_type::time_point kNoDeadline = clock_type::time_point::max();

// ------------------------------------------------------------------ listening

// A non-blocking, close-on-exec listening TCP socket for host:port ("": every
// local address; port 0: one the OS picks), with SO_REUSEADDR: the addresses
// getaddrinfo gives for them are tried in order and the first that binds and
// listens is kept. -1 when none does, with `why` set to the resolver's or the
// last address's error text.
int listen_tcp(const std::string& host, uint16_t port, int backlog, std::string& why);

// A non-blocking TCP socket connected to host:port, the addresses the name
// resolves to tried in order until one connects; each waits until `deadline`
// at most. -1 when none does, with `why` "cannot resolve HOST: ..." or
// "cannot connect to HOST:PORT[: the last address's error]".
int connect_tcp(const std::string& host, uint16_t port, clock_type::time_point deadline,
                std::string& why);

// A non-blocking, close-on-exec listening socket on the abstract Unix socket
// `name` (Linux: a name in the network namespace, no file; its leading NUL
// included). -1 when it cannot be bound (taken), with `why` set.
int listen_unix(const std::string& name, int backlog, std::string& why);

// A non-blocking socket connected to the abstract Unix socket `name`; -1
// when no one listens there (as in another network namespace), with `why`.
int connect_unix(const std::string& name, std::string& why);

// Whether the process at the other end of the Unix socket `fd` runs under
// this process's uid (SO_PEERCRED).
bool peer_runs_as_us(int fd);

// True when `host` is a numeric IPv4 or IPv6 address (no name to resolve).
bool numeric_address(const std::string& host);

// The local port a bound socket has (0 when it has none).
uint16_t local_port(int fd);

// "host:port" of a connected socket's other end (IPv6 without brackets); "?"
// when it has none.
std::string peer_of(int fd);

// The host part of peer_of's "host:port".
std::string host_of(const std::string& peer);

// ------------------------------------------------------------ blocking I/O

// Milliseconds for poll() from now until `deadline`: -1 for kNoDeadline, 0
// once it has passed.
int poll_timeout(clock_type::time_point deadline);

// Waits until `fd` is ready for `events` (or poll() fails): true; false
// once `deadline` has passed or `stop_fd` (when not -1) has become readable.
bool wait_ready(int fd, short events, clock_type::time_point deadline, int stop_fd = -1);

// Sends all of `data` on the non-blocking socket `fd`, never raising SIGPIPE;
// false when the socket fails, `deadline` passes first or `stop_fd` (when not
// -1) becomes readable.
bool send_all(int fd, std::string_view data, clock_type::time_point deadline, int stop_fd = -1);

// Reads exactly `out.size()` bytes within `deadline`; false on EOF, error or
// timeout (`why` says which, in the words of the gate's handshake, whose
// exchange and the rendezvous after it use this).
bool recv_exact(int fd, std::string& out, clock_type::time_point deadline, std::string* why);

// ------------------------------------------------------ descriptor passing

// Sends all of `data` on the non-blocking Unix socket `sock` with `fd`
// attached to its first byte (SCM_RIGHTS), within `deadline`; false when the
// socket fails or the deadline passes first.
bool send_with_fd(int sock, std::string_view data, int fd, clock_type::time_point deadline);

// Reads exactly `out.size()` bytes within `deadline`, and the descriptor
// that came with them into `*fd` (close-on-exec; -1 when none came). Any
// other descriptor the peer attached is closed at once, and a second one
// fails the read (closing the first). false on EOF, error, timeout or that.
bool recv_with_fd(int sock, std::string& out, int* fd, clock_type::time_point deadline);

// ----------------------------------------------------------------- reactor

// One poll() over a wake pipe and the descriptors watched for this turn.
// The serving thread, each turn: clear(), watch() what it serves, wait(),
// then revents() of each; any thread: wake(), which makes the current or the
// next wait() return at once.
class reactor {
 public:
  reactor();  // makes the wake pipe; problem() says why when it could not
  ~reactor();
  reactor(const reactor&) = delete;
  reactor& operator=(const reactor&) = delete;

  // "" once the wake pipe is there, else "pipe: <why>".
  const std::string& problem() const { return problem_; }

  // Safe from any thread and from the serving one; never blocks.
  void wake();

  // Forgets what the last turn watched.
  void clear() { fds_.resize(1); }
  // Watches `fd` for `events` in the next wait(); returns the index that
  // revents() takes for it (0 for the first watched after clear()).
  std::size_t watch(int fd, short events);

  // Polls the watched descriptors and the wake pipe for at most
  // `timeout_ms` (-1: no limit); empties the pipe when it was written to.
  // poll()'s result: -1 with errno set (EINTR included) when it failed.
  int wait(int timeout_ms);
  short revents(std::size_t index) const { return fds_[index + 1].revents; }
  // Whether the last wait() found the wake pipe written to.
  bool woken() const { return fds_[0].revents != 0; }

 private:
  int pipe_[2] = {-1, -1};
  std::vector<pollfd> fds_;  // the pipe's read end first
  std::string problem_;
};

}  // namespace troupe::net
