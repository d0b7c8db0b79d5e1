#include "monitoring/prometheus_exporter.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "monitoring/http_request.hpp"
#include "net/socket.hpp"

namespace troupe::monitoring {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr const char* kMetricsType = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* kTextType = "text/plain; charset=utf-8";
constexpr int kBacklog = 64;
// At most this many accepts per turn of the loop: a flood of connections
// waits in the backlog while the connections already held are served.
constexpr int kAcceptsPerTurn = 8;
// How long a peer that has its response may keep its connection open.
constexpr std::chrono::milliseconds kDrainLimit{500};

// One connection's slot; its buffer is allocated once, with the exporter.
struct connection {
  enum class phase { idle, reading, writing, draining };
  phase now = phase::idle;
  int fd = -1;
  std::string peer;  // its numeric address, without the port
  clock_type::time_point accepted, deadline;
  std::vector<char> in;  // max_request_bytes, fixed
  std::size_t received = 0;
  std::string out;  // our response
  std::size_t sent = 0;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::string show_endpoint(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

struct prometheus_exporter::state {
  std::shared_ptr<prometheus_registry> registry;
  exporter_options opts;
  int listen_fd = -1;
  net::reactor loop;  // the serving thread's poll; the destructor wakes it
  std::vector<connection> slots;

  ~state() {
    for (auto& c : slots) close_fd(c.fd);
    close_fd(listen_fd);
  }

  void count(int code) {
    registry->add("troupe_metrics_http_responses_total",
                  "responses of this process's /metrics endpoint, by status code",
                  {{"code", std::to_string(code)}}, 1);
  }

  void respond(connection& c, int code, const std::string& type, const std::string& body,
               bool head_only = false) {
    count(code);
    c.out = http_response(code, type, body, head_only);
    c.sent = 0;
    c.now = connection::phase::writing;
  }

  void finish(connection& c) {
    close_fd(c.fd);
    c.now = connection::phase::idle;
    c.out.clear();
    c.out.shrink_to_fit();
  }

  void route(connection& c, const request_line& r) {
    const bool metrics = r.path == "/metrics";
    const bool health = r.path == "/healthz";
    if (!metrics && !health) return respond(c, 404, kTextType, "not found: try /metrics\n");
    const bool head = r.method == "HEAD";
    if (r.method != "GET" && !head) return respond(c, 405, kTextType, "only GET and HEAD\n");
    if (health) return respond(c, 200, kTextType, "ok\n", head);
    respond(c, 200, kMetricsType, registry->render(), head);
  }

  // A peer's bytes: into the fixed buffer, never past it.
  void on_readable(connection& c) {
    if (c.now == connection::phase::draining) {
      char sink[1024];
      const ssize_t n = ::recv(c.fd, sink, sizeof sink, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) finish(c);
      return;
    }
    const ssize_t n = ::recv(c.fd, c.in.data() + c.received, c.in.size() - c.received, 0);
    if (n == 0) return finish(c);  // closed before a whole request: no answer
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) finish(c);
      return;
    }
    if (c.received == 0) c.deadline = c.accepted + opts.request_timeout;  // no longer idle
    c.received += static_cast<std::size_t>(n);
    request_line r;
    switch (parse_head(std::string_view(c.in.data(), c.received), r)) {
      case head_status::complete:
        return route(c, r);
      case head_status::bad:
        return respond(c, 400, kTextType, "bad request\n");
      case head_status::incomplete:
        if (c.received == c.in.size()) respond(c, 431, kTextType, "request too large\n");
        return;
    }
  }

  void on_writable(connection& c) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) finish(c);
      return;
    }
    c.sent += static_cast<std::size_t>(n);
    if (c.sent < c.out.size()) return;
    // Whatever the peer still sends is read and dropped until it closes (or
    // the deadline): closing with unread bytes would reset the connection
    // and could lose the response on the way.
    ::shutdown(c.fd, SHUT_WR);
    c.now = connection::phase::draining;
    c.deadline = std::min(c.deadline, clock_type::now() + kDrainLimit);
  }

  // Past its deadline: a request still incomplete gets 408 (one try, never
  // waiting for the peer); any other phase just ends.
  void on_deadline(connection& c) {
    if (c.now == connection::phase::reading) {
      count(408);
      const auto r = http_response(408, kTextType, "request timeout\n");
      (void)::send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    finish(c);
  }

  std::size_t held_by(const std::string& peer) const {
    return static_cast<std::size_t>(std::count_if(slots.begin(), slots.end(), [&](const auto& c) {
      return c.now != connection::phase::idle && c.peer == peer;
    }));
  }

  connection* free_slot() {
    for (auto& c : slots)
      if (c.now == connection::phase::idle) return &c;
    return nullptr;
  }

  void turn_away(int fd, const char* why) {
    count(503);
    const auto r = http_response(503, kTextType, why);
    (void)::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(fd);
  }

  // A new connection takes a free slot unless its address holds its share
  // already. Until its first byte it may stay idle_timeout, then
  // request_timeout from its accept.
  void admit(int fd, std::string peer) {
    if (held_by(peer) >= opts.max_per_address)
      return turn_away(fd, "too many connections from this address\n");
    connection* slot = free_slot();
    if (!slot) return turn_away(fd, "too many connections\n");
    auto& c = *slot;
    c.fd = fd;
    c.peer = std::move(peer);
    c.now = connection::phase::reading;
    c.received = 0;
    c.accepted = clock_type::now();
    c.deadline = c.accepted + std::min(opts.idle_timeout, opts.request_timeout);
  }

  void accept_some() {
    for (int k = 0; k < kAcceptsPerTurn; ++k) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left (or an error on one connection)
      // Its numeric address without the port: what the per-address limit counts.
      admit(fd, net::host_of(net::peer_of(fd)));
    }
  }
};

prometheus_exporter::prometheus_exporter(std::shared_ptr<prometheus_registry> registry,
                                         exporter_options opts)
    : st_(std::make_unique<state>()) {
  auto& st = *st_;
  st.registry = std::move(registry);
  st.opts = std::move(opts);
  st.opts.max_connections = std::max<std::size_t>(1, st.opts.max_connections);
  if (st.opts.max_per_address == 0)
    st.opts.max_per_address = std::max<std::size_t>(1, st.opts.max_connections / 4);
  st.opts.max_request_bytes = std::max<std::size_t>(64, st.opts.max_request_bytes);
  const std::string where = show_endpoint(st.opts.address, st.opts.port);
  if (!net::numeric_address(st.opts.address))
    throw exporter_error("'" + st.opts.address + "' is not a numeric IPv4 or IPv6 address");
  std::string why;
  st.listen_fd = net::listen_tcp(st.opts.address, st.opts.port, kBacklog, why);
  if (st.listen_fd < 0) throw exporter_error("cannot serve /metrics on " + where + ": " + why);
  port_ = net::local_port(st.listen_fd);
  if (!st.loop.problem().empty())
    throw exporter_error("cannot serve /metrics: " + st.loop.problem());
  st.slots.resize(st.opts.max_connections);
  for (auto& c : st.slots) c.in.resize(st.opts.max_request_bytes);
  thread_ = std::thread([this] { serve(); });
}

prometheus_exporter::~prometheus_exporter() {
  st_->loop.wake();
  if (thread_.joinable()) thread_.join();
}

std::string prometheus_exporter::endpoint() const {
  return show_endpoint(st_->opts.address, port_);
}

void prometheus_exporter::serve() {
  auto& st = *st_;
  std::vector<connection*> polled;  // the connection watched at index 1 + k
  for (;;) {
    st.loop.clear();
    polled.clear();
    st.loop.watch(st.listen_fd, POLLIN);
    auto wait = std::chrono::milliseconds(1000);
    const auto now = clock_type::now();
    for (auto& c : st.slots) {
      if (c.now == connection::phase::idle) continue;
      if (c.deadline <= now) {
        st.on_deadline(c);
        continue;
      }
      wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(c.deadline - now));
      const short events = c.now == connection::phase::writing ? POLLOUT : POLLIN;
      st.loop.watch(c.fd, events);
      polled.push_back(&c);
    }
    const int ready = st.loop.wait(static_cast<int>(wait.count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      spdlog::warn("/metrics: poll failed ({}); the endpoint stops", std::strerror(errno));
      return;
    }
    if (st.loop.woken()) return;  // the exporter ends
    if (st.loop.revents(0) & POLLIN) st.accept_some();
    for (std::size_t k = 0; k < polled.size(); ++k) {
      auto& c = *polled[k];
      const short ev = st.loop.revents(1 + k);
      if (!ev) continue;
      const bool writing = c.now == connection::phase::writing;
      if (ev & POLLERR)
        st.finish(c);
      else if (writing && (ev & POLLOUT))
        st.on_writable(c);
      else if (writing)
        st.finish(c);  // hung up before our response
      else
        st.on_readable(c);
    }
  }
}

}  // namespace troupe::monitoring
