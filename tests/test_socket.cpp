// The socket module under the gate, the TLS links, the rendezvous and the
// /metrics exporter (net/socket.hpp): listening and connecting with the
// errors their users show, all of a buffer sent or nothing, a deadline and
// a stop pipe that end a wait, the reactor's wake pipe, abstract Unix names
// and handing a descriptor over (the process ring's direct links).
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "net/socket.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

struct fd_closer {
  int fd;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
};

// A connected pair of non-blocking stream sockets.
struct socket_pair {
  int a = -1, b = -1;
  socket_pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
    a = fds[0];
    b = fds[1];
  }
  ~socket_pair() {
    ::close(a);
    ::close(b);
  }
};

}  // namespace

TEST_CASE("listen_tcp binds 127.0.0.1 on a free port; a taken port is refused with errno's text") {
  std::string why;
  const int fd = net::listen_tcp("127.0.0.1", 0, 16, why);
  REQUIRE(fd >= 0);
  fd_closer keep{fd};
  const uint16_t port = net::local_port(fd);
  CHECK(port > 0);
  const int again = net::listen_tcp("127.0.0.1", port, 16, why);
  CHECK(again == -1);
  CHECK(why == "Address already in use");
  CHECK(net::listen_tcp("no-such-host.invalid", 0, 16, why) == -1);
  CHECK_FALSE(why.empty());
}

TEST_CASE("connect_tcp reaches a listener and names the address it cannot reach") {
  std::string why;
  const int listener = net::listen_tcp("127.0.0.1", 0, 16, why);
  REQUIRE(listener >= 0);
  const uint16_t port = net::local_port(listener);
  {
    fd_closer l{listener};
    const int fd = net::connect_tcp("127.0.0.1", port, net::clock_type::now() + 10s, why);
    REQUIRE(fd >= 0);
    fd_closer c{fd};
    CHECK(net::peer_of(fd) == "127.0.0.1:" + std::to_string(port));
    CHECK(net::host_of(net::peer_of(fd)) == "127.0.0.1");
  }
  // The listener is closed: nothing listens on that port now.
  CHECK(net::connect_tcp("127.0.0.1", port, net::clock_type::now() + 10s, why) == -1);
  CHECK(why == "cannot connect to 127.0.0.1:" + std::to_string(port) + ": Connection refused");
  CHECK(net::connect_tcp("no-such-host.invalid", port, net::clock_type::now() + 10s, why) == -1);
  CHECK(why.rfind("cannot resolve no-such-host.invalid: ", 0) == 0);
}

TEST_CASE("numeric_address tells numeric IPv4 and IPv6 addresses from names") {
  CHECK(net::numeric_address("127.0.0.1"));
  CHECK(net::numeric_address("::1"));
  CHECK_FALSE(net::numeric_address("localhost"));
  CHECK_FALSE(net::numeric_address(""));
}

TEST_CASE("send_all and recv_exact move every byte; a silent peer and a closed one are named") {
  socket_pair p;
  // More than a socket buffer holds: send_all waits for the reader.
  const std::string sent(4 << 20, 'x');
  std::string got(sent.size(), '\0');
  std::string why;
  bool received = false;
  std::thread reader(
      [&] { received = net::recv_exact(p.b, got, net::clock_type::now() + 30s, &why); });
  CHECK(net::send_all(p.a, sent, net::clock_type::now() + 30s));
  reader.join();
  CHECK(received);
  CHECK(got == sent);

  std::string more(8, '\0');
  CHECK_FALSE(net::recv_exact(p.b, more, net::clock_type::now() + 50ms, &why));
  CHECK(why == "no answer within the handshake timeout");
  ::shutdown(p.a, SHUT_WR);
  CHECK_FALSE(net::recv_exact(p.b, more, net::clock_type::now() + 10s, &why));
  CHECK(why == "closed the connection during the handshake");
}

TEST_CASE("send_all gives up at its deadline or when its stop pipe is written, buffer full") {
  socket_pair p;
  const std::string big(16 << 20, 'y');  // never read: the buffer fills
  CHECK_FALSE(net::send_all(p.a, big, net::clock_type::now() + 100ms));
  int stop[2];
  REQUIRE(::pipe(stop) == 0);
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    REQUIRE(::write(stop[1], "s", 1) == 1);
  });
  CHECK_FALSE(net::send_all(p.a, big, net::kNoDeadline, stop[0]));
  stopper.join();
  ::close(stop[0]);
  ::close(stop[1]);
}

TEST_CASE("the reactor reports ready descriptors and wakes from another thread") {
  net::reactor loop;
  REQUIRE(loop.problem().empty());
  socket_pair p;
  loop.clear();
  CHECK(loop.watch(p.b, POLLIN) == 0);
  CHECK(loop.wait(0) == 0);
  CHECK_FALSE(loop.woken());
  REQUIRE(::write(p.a, "z", 1) == 1);
  CHECK(loop.wait(10000) == 1);
  CHECK((loop.revents(0) & POLLIN) != 0);
  CHECK_FALSE(loop.woken());

  // No limit: only wake() ends the wait; the pipe is emptied by it.
  char byte;
  REQUIRE(::read(p.b, &byte, 1) == 1);
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    loop.wake();
    loop.wake();
  });
  CHECK(loop.wait(-1) == 1);
  waker.join();
  CHECK(loop.woken());
  CHECK(loop.revents(0) == 0);
  // Both wakes were drained (or the second arrives now): the next turn waits
  // for the watched socket only.
  loop.wait(0);
  CHECK(loop.wait(0) == 0);
  CHECK_FALSE(loop.woken());
}

TEST_CASE("poll_timeout: none for no deadline, 0 once past") {
  CHECK(net::poll_timeout(net::kNoDeadline) == -1);
  CHECK(net::poll_timeout(net::clock_type::now() - 1s) == 0);
  const int ms = net::poll_timeout(net::clock_type::now() + 10s);
  CHECK(ms > 0);
  CHECK(ms <= 10000);
}

TEST_CASE("listen_unix takes an abstract name once; connect_unix reaches it, its peer is us") {
  const std::string name =
      std::string(1, '\0') + "troupe-test-socket-" + std::to_string(::getpid());
  std::string why;
  fd_closer l{net::listen_unix(name, 4, why)};
  REQUIRE(l.fd >= 0);
  fd_closer again{net::listen_unix(name, 4, why)};
  CHECK(again.fd < 0);
  CHECK(why == "Address already in use");
  fd_closer c{net::connect_unix(name, why)};
  REQUIRE(c.fd >= 0);
  CHECK(net::peer_runs_as_us(c.fd));
  fd_closer nowhere{net::connect_unix(name + "-nobody", why)};
  CHECK(nowhere.fd < 0);
  CHECK(why == "Connection refused");
}

TEST_CASE("send_with_fd hands a descriptor over; recv_with_fd takes one and refuses a second") {
  socket_pair p;
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  fd_closer r{pipe_fds[0]}, w{pipe_fds[1]};
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  REQUIRE(net::send_with_fd(p.a, "hello", w.fd, deadline));
  std::string got(5, '\0');
  int fd = -1;
  REQUIRE(net::recv_with_fd(p.b, got, &fd, deadline));
  fd_closer taken{fd};
  CHECK(got == "hello");
  REQUIRE(fd >= 0);
  CHECK(fd != w.fd);
  // The descriptor that came is the pipe's write end: what goes in comes out.
  REQUIRE(::write(fd, "x", 1) == 1);
  char c = 0;
  REQUIRE(::read(r.fd, &c, 1) == 1);
  CHECK(c == 'x');
  // Two messages with a descriptor each read as one: the second is refused
  // (and closed), so is the first.
  REQUIRE(net::send_with_fd(p.a, "ab", w.fd, deadline));
  REQUIRE(net::send_with_fd(p.a, "cd", w.fd, deadline));
  std::string four(4, '\0');
  int none = -1;
  CHECK_FALSE(net::recv_with_fd(p.b, four, &none, deadline));
  CHECK(none == -1);
  // Nothing at all by the deadline.
  std::string more(1, '\0');
  CHECK_FALSE(net::recv_with_fd(p.b, more, &none, std::chrono::steady_clock::now() + 50ms));
}
