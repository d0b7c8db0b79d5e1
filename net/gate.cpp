// The listening side of the gate (net/gate.hpp): the listener thread,
// the exchange with each connection, TLS and the hand-over to BASP; the
// listening sockets held between the rendezvous and the gate. The connecting
// side: net/gate_connect.cpp.
#include "net/gate.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <caf/io/basp_broker.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "config/secret.hpp"
#include "net/basp_guard.hpp"
#include "net/socket.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;

std::string errno_text(int e) {
  return std::strerror(e);
}

using net::host_of;
using net::local_port;
using net::peer_of;
using net::send_all;

// At most one warning a second; what was not logged is counted into the next.
class refusal_log {
 public:
  void warn(const std::string& me, const std::string& text) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto now = clock_type::now();
    if (now - last_ < std::chrono::seconds(1)) {
      ++held_;
      return;
    }
    last_ = now;
    if (held_ > 0)
      spdlog::warn("{}: {} (and {} more refused connections not logged since the last line)", me,
                   text, held_);
    else
      spdlog::warn("{}: {}", me, text);
    held_ = 0;
  }

 private:
  std::mutex mutex_;
  clock_type::time_point last_{};
  uint64_t held_ = 0;
};

int bind_listener(const std::string& host, uint16_t port);

// Listening socket for host:port, the one held for them if any; throws
// gate_error.
int listen_on(const std::string& host, uint16_t port) {
  if (const int held = held_listeners::take(host, port); held >= 0) return held;
  return bind_listener(host, port);
}

}  // namespace

namespace held_listeners {
namespace {
std::mutex held_mutex;
std::map<std::pair<std::string, uint16_t>, int> held;
}  // namespace

uint16_t hold(const std::string& host, uint16_t port) {
  const int fd = bind_listener(host, port);
  const uint16_t bound = local_port(fd);
  keep(host, bound, fd);
  return bound;
}

void keep(const std::string& host, uint16_t port, int fd) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> guard(held_mutex);
  auto [at, fresh] = held.try_emplace({host, port}, fd);
  if (!fresh) {
    ::close(at->second);
    at->second = fd;
  }
}

int take(const std::string& host, uint16_t port) {
  std::lock_guard<std::mutex> guard(held_mutex);
  auto at = held.find({host, port});
  if (at == held.end()) return -1;
  const int fd = at->second;
  held.erase(at);
  return fd;
}
}  // namespace held_listeners

namespace {

// A new listening socket for host:port; throws gate_error.
int bind_listener(const std::string& host, uint16_t port) {
  std::string why;
  const int fd = net::listen_tcp(host, port, 128, why);
  if (fd < 0)
    throw gate_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  return fd;
}

}  // namespace

// ---------------------------------------------------------------- listener

struct gate::state {
  caf::actor_system* sys = nullptr;  // null: admitted sockets go to on_admitted
  gate_admit_handler on_admitted;
  caf::actor basp;
  caf::strong_actor_ptr whom;
  std::set<std::string> ifs;
  gate_options opts;
  std::string key;          // derive_key(opts.secret, key_purpose::gate)
  link_security side_link;  // the side door's: TLS keyed from the secret
  int listener = -1;
  uint16_t port = 0;  // also the key BASP files the served actor under
  net::reactor loop;  // the listener thread's poll; stop_thread() wakes it
  int reserve = -1;   // a spare fd, given up to accept-and-close when out of fds
  std::atomic<bool> stopping{false};
  refusal_log log;
  mutable std::mutex stats_mutex;
  gate_stats stats;

  struct pending {
    int fd;
    std::string peer;
    std::string host;  // peer without the port
    std::string challenge;
    std::string frame;  // kProofBytes, filled as bytes arrive
    std::size_t got = 0;
    clock_type::time_point deadline;
    // Once the proof checked out (then a certificate proof may follow).
    gate_wire::proof_check check;
    bool to_side = false;
  };
  std::deque<pending> waiting;  // oldest first
  // opts.max_pending, or a quarter of the process's descriptor limit if that
  // is less: handshakes must not take the descriptors the job needs
  // (checkpoints, data files, its peers).
  std::size_t max_pending = 0;
  // At most this many of them from one address (half of max_pending), so
  // one host flooding the gate leaves room for the others.
  std::size_t max_per_host = 0;
  // New connections taken per turn of the loop, so proofs already on their
  // way are read between accepts rather than after a flood of them.
  static constexpr int kAcceptsPerTurn = 32;
  std::minstd_rand rng{std::random_device{}()};

  // Which pending handshake makes room: among those (from `host`, when not
  // empty) the oldest that has sent nothing yet, else one at random, so
  // neither holding connections idle nor sending partial proofs keeps a
  // real peer's handshake from finishing.
  std::size_t victim(const std::string& host) {
    std::vector<std::size_t> candidates;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      if (!host.empty() && waiting[i].host != host) continue;
      if (waiting[i].got == 0) return i;
      candidates.push_back(i);
    }
    if (candidates.empty()) return 0;
    return candidates[std::uniform_int_distribution<std::size_t>(0, candidates.size() - 1)(rng)];
  }
  void evict(const std::string& host, const std::string& why) {
    auto i = victim(host);
    refuse(waiting[i], why, &gate_stats::evicted);
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void count(uint64_t gate_stats::*field) {
    std::lock_guard<std::mutex> guard(stats_mutex);
    ++(stats.*field);
  }

  void refuse(pending& p, const std::string& why, uint64_t gate_stats::*field,
              const std::string& claimed = {}) {
    count(field);
    log.warn(opts.name, claimed.empty() ? "refused a connection from " + p.peer + ": " + why
                                        : "refused a peer claiming to be " + claimed + " (" +
                                              p.peer + "): " + why);
    ::close(p.fd);
    p.fd = -1;
  }

  void accept_some() {
    for (int taken = 0; taken < kAcceptsPerTurn; ++taken) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if ((errno == EMFILE || errno == ENFILE) && !waiting.empty()) {
          // Out of descriptors: the oldest handshake makes room, as when
          // max_pending is reached, so held connections cannot lock peers out.
          evict({}, "this process is out of file descriptors (a pending handshake dropped)");
          continue;
        }
        if ((errno == EMFILE || errno == ENFILE) && reserve >= 0) {
          // Out of descriptors with nothing to evict: take the connection
          // with the spare fd and drop it, so the listener does not stay
          // readable and spin.
          ::close(reserve);
          int dropped = ::accept(listener, nullptr, nullptr);
          if (dropped >= 0) {
            count(&gate_stats::refused);
            log.warn(opts.name, "refused a connection from " + peer_of(dropped) +
                                    ": this process is out of file descriptors");
            ::close(dropped);
          }
          reserve = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          continue;
        }
        return;  // EAGAIN, or an error the next poll retries
      }
      auto peer = peer_of(fd);
      auto host = host_of(peer);
      const auto from_host = static_cast<std::size_t>(std::count_if(
          waiting.begin(), waiting.end(), [&](const pending& w) { return w.host == host; }));
      if (from_host >= max_per_host)
        evict(host, "too many connections from " + host + " still in their handshake");
      else if (waiting.size() >= max_pending)
        evict({}, "too many connections still in their handshake");
      pending p{fd,
                std::move(peer),
                std::move(host),
                make_challenge(),
                std::string(gate_wire::kProofBytes, '\0'),
                0,
                clock_type::now() + opts.handshake_timeout,
                {},
                false};
      auto hello = gate_wire::make_hello(p.challenge);
      // 72 bytes on a fresh socket always fit its send buffer.
      if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(hello.size())) {
        refuse(p, "closed before the handshake", &gate_stats::refused);
        continue;
      }
      waiting.push_back(std::move(p));
    }
  }

  // Reads what `p` sent into its frame; true when the peer closed (refused
  // here), false when it waits for more; p.got == p.frame.size() once whole.
  bool read_frame(pending& p) {
    while (p.got < p.frame.size()) {
      ssize_t n = ::recv(p.fd, p.frame.data() + p.got, p.frame.size() - p.got, 0);
      if (n > 0) {
        p.got += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      refuse(p, "closed the connection during the handshake", &gate_stats::refused);
      return true;
    }
    return false;
  }

  // Reads what `p` sent; true when it is done with (admitted or refused).
  bool on_readable(pending& p) {
    for (;;) {
      if (read_frame(p)) return true;
      if (p.got < p.frame.size()) return false;
      const auto step = p.check.name.empty() ? on_proof(p) : on_certificate(p);
      if (step != next::read_more) return true;
    }
  }

  enum class next { read_more, done };

  // The proof frame is whole.
  next on_proof(pending& p) {
    auto check = gate_wire::check_proof(key, p.challenge, p.frame);
    // The side door answers as its own name, so a verdict for it is never
    // one for the node (the connector checks the name it dialed).
    const bool to_side =
        !opts.side_door.empty() && opts.on_side_door && check.target == opts.side_door;
    const std::string& answering = to_side ? opts.side_door : opts.name;
    auto tell_refused = [&] {
      send_all(p.fd,
               gate_wire::make_verdict(false, key, answering, p.challenge, check.client_challenge),
               clock_type::now() + std::chrono::milliseconds(100));
    };
    if (!check.problem.empty()) {
      if (check.well_formed) tell_refused();  // a wrong secret: told so
      refuse(p, check.problem, &gate_stats::refused);
      return next::done;
    }
    // The proof is genuine; is it meant for this task, from a task of the
    // cluster?
    if (!check.target.empty() && check.target != opts.name && !to_side) {
      tell_refused();
      refuse(p, "its proof is meant for " + check.target + ", not this task", &gate_stats::refused,
             check.name);
      return next::done;
    }
    if (!opts.allowed_peers.empty() && opts.allowed_peers.count(check.name) == 0) {
      tell_refused();
      refuse(p, check.name + " is not a task of this cluster", &gate_stats::refused, check.name);
      return next::done;
    }
    if (sys && task_has_live_link(sys->node(), check.name)) {
      // No verdict: to the connector this is a listener that went away, which
      // it retries until its deadline; a task whose old connection is still
      // closing (a restarted process) gets in once it has closed.
      refuse(p,
             check.name + " has a live connection here already: a second connection may not " +
                 "claim a live task",
             &gate_stats::refused, check.name);
      return next::done;
    }
    p.check = std::move(check);
    p.to_side = to_side;
    if (!opts.certificate_proof || to_side) return accept(p);
    // Certificates: the certificate proof's header next.
    p.frame.assign(gate_wire::kCertHeaderBytes, '\0');
    p.got = 0;
    return next::read_more;
  }

  // Past its deadline: a connection that proved the key but owes its
  // certificate (a holder of the secret with no task's certificate, or a
  // task configured without one) is named, any other is not.
  void time_out(pending& p) {
    const auto within = std::to_string(opts.handshake_timeout.count()) + " ms";
    if (p.check.name.empty())
      refuse(p, "no handshake within " + within, &gate_stats::timed_out);
    else
      refuse(p, "proved the key but sent no certificate within " + within, &gate_stats::timed_out,
             p.check.name);
  }

  // The certificate proof's header, then its body, is whole.
  next on_certificate(pending& p) {
    auto tell_refused = [&](const std::string& why) {
      send_all(
          p.fd,
          gate_wire::make_verdict(false, key, opts.name, p.challenge, p.check.client_challenge),
          clock_type::now() + std::chrono::milliseconds(100));
      refuse(p, why, &gate_stats::refused, p.check.name);
      return next::done;
    };
    if (p.frame.size() == gate_wire::kCertHeaderBytes) {
      const auto length = gate_wire::certificate_proof_length(p.frame);
      if (length < 0)
        return tell_refused("no certificate proof (this cluster's links need a certificate)");
      p.frame.resize(gate_wire::kCertHeaderBytes + static_cast<std::size_t>(length), '\0');
      return next::read_more;
    }
    const auto why = gate_certificate::check_proof(
        opts.link, p.frame,
        gate_wire::certificate_transcript(p.challenge, p.check.client_challenge, p.check.name,
                                          p.check.target),
        p.check.name);
    if (!why.empty()) return tell_refused(why);
    return accept(p);
  }

  next accept(pending& p) {
    const auto& answering = p.to_side ? opts.side_door : opts.name;
    auto verdict =
        gate_wire::make_verdict(true, key, answering, p.challenge, p.check.client_challenge);
    if (!send_all(p.fd, verdict, clock_type::now() + std::chrono::seconds(1))) {
      refuse(p, p.check.name + " left during the handshake", &gate_stats::refused);
      return next::done;
    }
    admit(p, p.check.name, p.check.client_challenge, p.to_side);
    return next::done;
  }

  void admit(pending& p, const std::string& name, const std::string& client_challenge,
             bool to_side) {
    spdlog::info("{}: {} at {} passed the gate{}", opts.name, name, p.peer,
                 to_side ? " to " + opts.side_door : std::string());
    count(&gate_stats::admitted);
    const int fd = p.fd;
    p.fd = -1;  // the link's, now
    // TLS on the socket; BASP (or the handler) gets the plain end, where
    // nothing arrives before the TLS handshake succeeded.
    link_params lp;
    lp.listener = true;
    lp.me = to_side ? opts.side_door : opts.name;
    lp.peer_task = name;
    lp.peer_address = p.peer;
    lp.server_challenge = p.challenge;
    lp.client_challenge = client_challenge;
    const auto& handler = to_side ? opts.on_side_door : on_admitted;
    if (!handler) lp.local_node = serialized_node_id(sys->node());
    link_end end;
    try {
      end = open_link(fd, to_side ? side_link : opts.link, std::move(lp));
    } catch (const link_error& e) {
      spdlog::error("{}: cannot secure the connection with {} ({}): {}", opts.name, name, p.peer,
                    e.what());
      return;  // open_link closed the socket
    }
    if (handler) {
      handler(end.plain_fd, name, p.peer);
      return;
    }
    auto scribe = sys->middleman().backend().new_scribe(end.plain_fd);
    caf::anon_send(basp, caf::publish_atom::value, std::move(scribe), port, whom, ifs);
  }
};

gate::gate(caf::actor_system& sys, caf::strong_actor_ptr whom, std::set<std::string> ifs,
           const std::string& host, uint16_t port, gate_options opts)
    : st_(std::make_unique<state>()) {
  st_->sys = &sys;
  st_->basp = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  st_->whom = std::move(whom);
  st_->ifs = std::move(ifs);
  start(host, port, std::move(opts));
}

gate::gate(const std::string& host, uint16_t port, gate_options opts,
           gate_admit_handler on_admitted)
    : st_(std::make_unique<state>()) {
  if (!on_admitted) throw gate_error("gate: no handler for admitted connections");
  st_->on_admitted = std::move(on_admitted);
  start(host, port, std::move(opts));
}

gate_options with_link_key(gate_options opts) {
  // With certificates the gate asks for one whether or not there is a secret:
  // a holder of the secret is not a task, so it reaches no TLS state either
  // (the side door, for tasks that have no certificate yet, is exempt).
  if (opts.link.kind == link_security::trust::certificates) {
    if (opts.secret.empty()) opts.secret = certificates_only_secret(opts.link);
    opts.certificate_proof = true;
  }
  if (opts.link.kind == link_security::trust::psk && opts.link.psk_key.empty())
    opts.link.psk_key = derive_key(opts.secret, key_purpose::tls_psk);
  return opts;
}

void gate::start(const std::string& host, uint16_t port, gate_options opts) {
  if (opts.name.empty() || opts.name.size() >= gate_wire::kNameBytes)
    throw gate_error("gate: a task name of 1 to 63 bytes is needed, got '" + opts.name + "'");
  opts = with_link_key(std::move(opts));
  st_->opts = std::move(opts);
  st_->key = derive_key(st_->opts.secret, key_purpose::gate);
  if (!st_->opts.side_door.empty()) {
    if (st_->opts.side_door.size() >= gate_wire::kNameBytes)
      throw gate_error("gate: a side door name of at most 63 bytes is needed, got '" +
                       st_->opts.side_door + "'");
    st_->side_link.kind = link_security::trust::psk;
    st_->side_link.psk_key = derive_key(st_->opts.secret, key_purpose::tls_psk);
    st_->side_link.max_frame_bytes = st_->opts.link.max_frame_bytes;
    st_->side_link.handshake_timeout = st_->opts.link.handshake_timeout;
  }
  st_->listener = listen_on(host, port);
  port_ = st_->port = local_port(st_->listener);
  if (!st_->loop.problem().empty()) {
    ::close(st_->listener);
    throw gate_error("gate: " + st_->loop.problem());
  }
  st_->reserve = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  st_->max_pending = std::max<std::size_t>(1, st_->opts.max_pending);
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
    st_->max_pending =
        std::max<std::size_t>(1, std::min<std::size_t>(st_->max_pending, nofile.rlim_cur / 4));
  st_->max_per_host = std::max<std::size_t>(1, st_->max_pending / 2);
  thread_ = std::thread([this] { loop(); });
}

void gate::stop_thread() {
  st_->stopping = true;
  st_->loop.wake();
  if (thread_.joinable()) thread_.join();
}

int gate::release_listener() {
  stop_thread();
  return std::exchange(st_->listener, -1);
}

gate::~gate() {
  stop_thread();
  for (auto& p : st_->waiting)
    if (p.fd >= 0) ::close(p.fd);
  for (int fd : {st_->listener, st_->reserve})
    if (fd >= 0) ::close(fd);
}

gate_stats gate::stats() const {
  std::lock_guard<std::mutex> guard(st_->stats_mutex);
  return st_->stats;
}

void gate::loop() {
  // Nothing a peer sends can throw here; the kernel failing to supply random
  // bytes for a challenge can, or poll failing. The gate then closes its
  // port (no one is left to answer it), says why, and tells its owner
  // (opts.on_failure), rather than take the process down from its own thread.
  std::string why;
  try {
    serve();
    return;
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "unknown error";
  }
  if (st_->listener >= 0) {
    ::close(st_->listener);
    st_->listener = -1;
  }
  for (auto& p : st_->waiting)
    if (p.fd >= 0) {
      ::close(p.fd);
      p.fd = -1;
    }
  spdlog::error("{}: the gate stopped listening: {}", st_->opts.name, why);
  if (st_->opts.on_failure) st_->opts.on_failure(why);
}

void gate::serve() {
  auto& st = *st_;
  while (!st.stopping) {
    if (st.opts.on_turn) st.opts.on_turn();
    st.loop.clear();
    st.loop.watch(st.listener, POLLIN);
    auto now = clock_type::now();
    auto next = now + std::chrono::seconds(1);
    for (auto& p : st.waiting) {
      st.loop.watch(p.fd, POLLIN);
      next = std::min(next, p.deadline);
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    int n = st.loop.wait(static_cast<int>(std::max<int64_t>(wait, 0) + 1));
    if (n < 0 && errno != EINTR) throw std::runtime_error("poll failed: " + errno_text(errno));
    if (st.stopping) return;
    // Pending connections first (watched from index 1 on, in order), then
    // new ones, which may evict from the front of `waiting`.
    now = clock_type::now();
    for (std::size_t i = 0; i < st.waiting.size(); ++i) {
      auto& p = st.waiting[i];
      if (st.loop.revents(i + 1) != 0) {
        st.on_readable(p);
      } else if (now >= p.deadline) {
        st.time_out(p);
      }
    }
    st.waiting.erase(std::remove_if(st.waiting.begin(), st.waiting.end(),
                                    [](const state::pending& p) { return p.fd < 0; }),
                     st.waiting.end());
    if (st.loop.revents(0) != 0) st.accept_some();
  }
}

}  // namespace troupe
