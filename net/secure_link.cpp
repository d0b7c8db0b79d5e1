#include "net/secure_link.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "config/cluster.hpp"
#include "config/secret.hpp"
#include "crypto/crypto.hpp"
#include "net/basp_guard.hpp"
#include "net/fork_join_pool.hpp"
#include "net/frame_budget.hpp"
#include "net/tls_records.hpp"

#include "net/job_ca.hpp"
#include "net/secure_link_detail.hpp"
#include "net/socket.hpp"

namespace troupe {

namespace {

using namespace secure_link_detail;

// Blocks SIGPIPE on the calling thread: a write to a peer that vanished then
// fails with EPIPE and the link closes, instead of ending the process.
void block_sigpipe() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

// The thread that runs every link's handshake, and reaps the links that
// ended.
class link_hub {
 public:
  static link_hub& instance() {
    static link_hub hub;
    return hub;
  }

  SSL_CTX* context(const link_security& sec) {
    std::lock_guard<std::mutex> guard(ctx_mutex_);
    auto& slot = contexts_[context_key(sec)];
    if (!slot) slot = make_context(sec);
    return slot.get();
  }

  void add(std::unique_ptr<link> l) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      incoming_.push_back(std::move(l));
    }
    ++counters_.opened;
    wake();
  }

  link_stats totals() const {
    return {counters_.opened.load(),      counters_.failed.load(),   counters_.guard_closed.load(),
            counters_.dropped.load(),     counters_.bytes_in.load(), counters_.bytes_out.load(),
            counters_.key_updates.load(), counters_.evicted.load()};
  }

  void wake() { loop_.wake(); }

 private:
  link_hub() {
    // OpenSSL's own exit handler is registered now, before this hub's
    // destructor is: at exit the hub (its threads, its contexts) goes
    // first, then OpenSSL's cleanup.
    OPENSSL_init_ssl(0, nullptr);
    if (!loop_.problem().empty()) throw link_error("TLS links: " + loop_.problem());
    thread_ = std::thread([this] {
      block_sigpipe();
      run();
      OPENSSL_thread_stop();
    });
  }
  ~link_hub() {
    stopping_ = true;
    wake();
    if (thread_.joinable()) thread_.join();
    for (auto& l : open_) l->stop();
    open_.clear();  // joins their threads
    links_.clear();
    incoming_.clear();
    contexts_.clear();
  }

  void run();
  void handshake(link& l);
  std::string check_peer(link& l);
  void fail(link& l, const std::string& why, bool handshake_failure);
  // Hands an open link to its two threads.
  void start_pumps(std::unique_ptr<link> l);
  // Keys the link's record layer from its traffic secrets, then frees its
  // SSL and wipes the secrets; "" or why it cannot.
  std::string key_records(link& l);
  // Moves what OpenSSL wrote to `wire` and sends what the socket takes.
  void send_wire(link& l);
  // Closes the oldest accepted links in their handshake beyond
  // max_tls_handshakes(), logged at most once a second.
  void evict_excess_handshakes(clock_type::time_point now);

  std::mutex mutex_;
  std::vector<std::unique_ptr<link>> incoming_;
  std::vector<std::unique_ptr<link>> links_;  // in their handshake: the hub thread's
  std::vector<std::unique_ptr<link>> open_;   // running on their own threads
  std::mutex ctx_mutex_;
  std::map<std::string, ctx_ptr> contexts_;
  net::reactor loop_;  // the hub thread's poll; wake() from any thread
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  link_counters counters_;
  clock_type::time_point last_eviction_line_{};
  uint64_t evictions_unlogged_ = 0;
  // Lanes that seal and open the records of a link's larger chunks beside
  // its pump thread (none on small machines: see default_helpers).
  fork_join_pool crypto_{fork_join_pool::default_helpers(), [] { OPENSSL_thread_stop(); }};
};

void link_hub::run() {
  while (!stopping_) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      for (auto& l : incoming_) links_.push_back(std::move(l));
      incoming_.clear();
    }
    // Links whose threads both ended: joined and closed here.
    open_.erase(std::remove_if(open_.begin(), open_.end(),
                               [](const std::unique_ptr<link>& l) { return l->running == 0; }),
                open_.end());
    loop_.clear();
    auto now = clock_type::now();
    evict_excess_handshakes(now);
    auto next = now + std::chrono::seconds(1);
    for (auto& l : links_) {
      loop_.watch(l->tcp, static_cast<short>(POLLIN | (l->pending_wire() > 0 ? POLLOUT : 0)));
      // A new link speaks first (a client's hello) without waiting for a
      // byte: its wake may have been spent on the turn before it was taken.
      next = std::min(next, l->started ? l->deadline : now);
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    loop_.wait(static_cast<int>(std::max<int64_t>(wait, 0)));
    now = clock_type::now();
    for (std::size_t i = 0; i < links_.size(); ++i) {
      auto& l = *links_[i];
      if (l.done) continue;  // evicted
      // A new link's first handshake step sends its hello unprompted.
      if (loop_.revents(i) != 0 || !l.started) {
        handshake(l);
        if (l.ssl && !l.done) send_wire(l);  // the handshake's flights
      }
      l.started = true;
      if (!l.done && !l.open && now >= l.deadline)
        fail(l, "no TLS handshake within " + std::to_string(l.timeout_ms) + " ms", true);
    }
    for (auto& l : links_)
      if (l->open && !l->done) start_pumps(std::move(l));
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [](const std::unique_ptr<link>& l) { return !l || l->done; }),
                 links_.end());
  }
}

void link_hub::evict_excess_handshakes(clock_type::time_point now) {
  std::vector<link*> waiting;
  for (auto& l : links_)
    if (l->p.listener && !l->done && !l->open) waiting.push_back(l.get());
  const auto cap = max_tls_handshakes();
  if (waiting.size() <= cap) return;
  // The same timeout for all: the earliest deadline is the oldest link.
  std::sort(waiting.begin(), waiting.end(),
            [](const link* a, const link* b) { return a->deadline < b->deadline; });
  const auto excess = waiting.size() - cap;
  for (std::size_t i = 0; i < excess; ++i) {
    auto& l = *waiting[i];
    ++counters_.evicted;
    l.decide(fmt::format("evicted: more than {} TLS handshakes at once", cap));
    l.done = true;
  }
  evictions_unlogged_ += excess;
  if (now - last_eviction_line_ < std::chrono::seconds(1)) return;
  spdlog::warn(
      "{}: more than {} connections in their TLS handshake at once: closed the oldest, with {} "
      "({} closed since the last line)",
      waiting[excess - 1]->p.me, cap, waiting[excess - 1]->who(), evictions_unlogged_);
  last_eviction_line_ = now;
  evictions_unlogged_ = 0;
}

void link_hub::send_wire(link& l) {
  if (l.wbio) {
    char* data = nullptr;
    long n = BIO_get_mem_data(l.wbio, &data);
    if (n > 0) {
      l.wire.insert(l.wire.end(), data, data + n);
      (void)BIO_reset(l.wbio);
    }
  }
  while (l.pending_wire() > 0) {
    ssize_t n = ::send(l.tcp, l.wire.data() + l.wire_off, l.pending_wire(), MSG_NOSIGNAL);
    if (n > 0) {
      l.wire_off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    l.wire.clear();  // the peer is gone; the read side will say so
    l.wire_off = 0;
    return;
  }
  if (l.pending_wire() == 0) {
    l.wire.clear();
    l.wire_off = 0;
  }
}

void link_hub::fail(link& l, const std::string& why, bool handshake_failure) {
  if (handshake_failure) ++counters_.failed;
  send_wire(l);  // an alert OpenSSL wrote, best effort
  spdlog::warn("{}: closed the connection with {}: {}", l.p.me, l.who(), why);
  l.decide(why);
  l.done = true;
}

std::string link_hub::check_peer(link& l) {
  if (!l.ssl) return {};
  if (!l.psk.empty()) {
    if (SSL_session_reused(l.ssl) != 1) return "it did not use the cluster's pre-shared key";
    return {};
  }
  X509* cert = SSL_get0_peer_certificate(l.ssl);
  if (!cert) return "it presented no certificate";
  if (SSL_get_verify_result(l.ssl) != X509_V_OK)
    return std::string("its certificate: ") +
           X509_verify_cert_error_string(SSL_get_verify_result(l.ssl));
  if (!certificate_names(cert, l.p.peer_task))
    return "its certificate does not name the task " + l.p.peer_task;
  return {};
}

void link_hub::handshake(link& l) {
  if (!l.ssl) {
    l.open = true;
    l.decide({});
    return;
  }
  ERR_clear_error();
  int r = SSL_do_handshake(l.ssl);
  if (r == 1) {
    if (auto problem = check_peer(l); !problem.empty()) return fail(l, problem, true);
    if (l.client_secret.size() != 32 || l.server_secret.size() != 32)
      return fail(l, "TLS: the handshake left no application traffic secrets", true);
    if (SSL_has_pending(l.ssl))  // read_ahead is off: the peer sent early data
      return fail(l, "TLS: application data before the handshake ended", true);
    l.open = true;
    spdlog::debug("{}: TLS 1.3 with {} ({})", l.p.me, l.who(), SSL_get_cipher_name(l.ssl));
    // A TLS 1.3 client finishes before the server has checked its
    // certificate; BASP's listener speaks first, so its first bytes are the
    // verdict (a refusal arrives as an alert instead).
    if (l.p.listener || !l.guard) l.decide({});
    return;
  }
  int e = SSL_get_error(l.ssl, r);
  // (Writes go to memory: OpenSSL never waits to write.)
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return;
  std::string why = "TLS handshake failed: ";
  if (!l.psk_problem.empty()) {
    why += l.psk_problem;
  } else if (SSL_get_verify_result(l.ssl) != X509_V_OK) {
    why +=
        std::string("certificate: ") + X509_verify_cert_error_string(SSL_get_verify_result(l.ssl));
  } else if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    why += "the peer closed the connection";
  } else {
    why += ssl_errors();
  }
  fail(l, why, true);
}

// A pump that throws (no memory, a record layer failure) ends its link,
// named in the log, never the process.
template <typename Pump>
void run_pump(link& l, Pump& pump) {
  std::string why;
  try {
    pump();
    return;
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "an unknown exception";
  }
  spdlog::warn("{}: closed the connection with {}: {}", l.p.me, l.who(), why);
  l.decide(why);
  l.stop();
}

std::string link_hub::key_records(link& l) {
  if (!l.ssl) return "";
  try {
    const auto& mine = l.p.listener ? l.server_secret : l.client_secret;
    const auto& theirs = l.p.listener ? l.client_secret : l.server_secret;
    l.writer = std::make_unique<tls13::record_writer>(mine, &crypto_, l.records_per_key);
    l.reader = std::make_unique<tls13::record_reader>(theirs, &crypto_);
  } catch (const std::exception& e) {
    return std::string("TLS: cannot key the record layer: ") + e.what();
  }
  // The records have their keys: OpenSSL's session, the secrets and the
  // pre-shared key are no longer needed here.
  SSL_free(l.ssl);
  l.ssl = nullptr;
  l.wbio = nullptr;  // (was the SSL's)
  l.forget_keys();
  return "";
}

void link_hub::start_pumps(std::unique_ptr<link> owned) {
  auto& l = *owned;
  if (::pipe2(l.stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    fail(l, std::string("pipe: ") + std::strerror(errno), false);
    return;
  }
  if (auto why = key_records(l); !why.empty()) return fail(l, why, false);
  std::vector<char> pending(l.wire.begin() + static_cast<std::ptrdiff_t>(l.wire_off), l.wire.end());
  l.wire.clear();
  l.running = 2;
  auto body = [this, &l](auto pump) {
    block_sigpipe();
    run_pump(l, pump);
    OPENSSL_thread_stop();
    if (--l.running == 0) wake();  // the hub joins and closes it
  };
  l.inbound = std::thread(body, [this, &l] { pump_inbound(l, counters_); });
  l.outbound = std::thread(body, [this, &l, pending = std::move(pending)]() mutable {
    pump_outbound(l, counters_, std::move(pending));
  });
  open_.push_back(std::move(owned));
}

}  // namespace

link_security link_security_for(const cluster_spec& spec, const std::string& secret,
                                uint64_t max_frame_bytes) {
  link_security s;
  s.max_frame_bytes = spec.max_message_mb > 0
                          ? static_cast<uint64_t>(spec.max_message_mb * double(1 << 20))
                          : max_frame_bytes;
  if (spec.insecure) {
    s.kind = link_security::trust::insecure;
  } else if (!spec.tls.ca.empty()) {
    s.kind = link_security::trust::certificates;
    s.ca_file = spec.tls.ca;
    s.cert_file = spec.tls.cert;
    s.key_file = spec.tls.key;
  } else if (auto issued = issued_identity::held();
             issued && spec.identity == cluster_spec::identity_mode::job_ca) {
    s.kind = link_security::trust::certificates;
    s.identity = std::move(issued);
  } else {
    if (secret.empty())
      throw link_error("cluster: TLS needs the cluster secret, or certificates in cluster.tls");
    s.psk_key = derive_key(secret, key_purpose::tls_psk);
  }
  return s;
}

std::string certificates_only_secret(const link_security& sec) {
  return "troupe: certificates only, the gate keyed from the cluster CA " +
         ca_certificates_digest(sec);
}

void check_link_security(const link_security& sec) {
  if (sec.kind == link_security::trust::certificates) link_hub::instance().context(sec);
}

link_end open_link(int tcp_fd, const link_security& sec, link_params p) {
  auto l = std::make_unique<link>();
  l->tcp = tcp_fd;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) != 0)
    throw link_error(std::string("socketpair: ") + std::strerror(errno));  // ~link closes tcp_fd
  l->plain = pair[0];
  link_end end;
  end.plain_fd = pair[1];
  int one = 1;
  ::setsockopt(tcp_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buffer = 1 << 20;
  for (int fd : {pair[0], pair[1]}) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  }
  if (sec.kind != link_security::trust::insecure) {
    auto& hub = link_hub::instance();
    SSL* ssl = nullptr;
    try {
      ssl = SSL_new(hub.context(sec));
    } catch (...) {
      ::close(end.plain_fd);
      throw;
    }
    if (!ssl) {
      ::close(end.plain_fd);
      throw link_error("TLS: SSL_new: " + ssl_errors());
    }
    l->ssl = ssl;
    // Reads straight from the socket; writes into memory, sent in batches.
    BIO* rbio = BIO_new_socket(tcp_fd, BIO_NOCLOSE);
    l->wbio = BIO_new(BIO_s_mem());
    SSL_set_bio(ssl, rbio, l->wbio);
    SSL_set_app_data(ssl, l.get());
    if (p.listener)
      SSL_set_accept_state(ssl);
    else
      SSL_set_connect_state(ssl);
    if (sec.kind == link_security::trust::psk) {
      const auto& listener_task = p.listener ? p.me : p.peer_task;
      const auto& connector_task = p.listener ? p.peer_task : p.me;
      std::string info = "troupe tls13 link";
      info += '\0';
      info += listener_task;
      info += '\0';
      info += connector_task;
      l->psk = crypto::hkdf(p.server_challenge + p.client_challenge, sec.psk_key, info, 32);
    }
  }
  if (!p.local_node.empty())
    l->guard = std::make_unique<basp_guard>(
        p.listener ? basp_guard::side::listener : basp_guard::side::connector, p.local_node,
        p.peer_task, sec.max_frame_bytes);
  l->records_per_key = sec.records_per_key;
  l->unfinished_limit = sec.max_unfinished_bytes > 0 ? sec.max_unfinished_bytes
                                                     : unfinished_budget(sec.max_frame_bytes);
  l->deadline = clock_type::now() + sec.handshake_timeout;
  l->timeout_ms = sec.handshake_timeout.count();
  l->p = std::move(p);
  end.ready = l->ready.get_future().share();
  link_hub::instance().add(std::move(l));
  return end;
}

std::size_t max_tls_handshakes() {
  static const std::size_t cap = [] {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
      return std::size_t{64};
    return std::clamp<std::size_t>(static_cast<std::size_t>(limit.rlim_cur / 16), 4, 64);
  }();
  return cap;
}

link_stats link_totals() {
  return link_hub::instance().totals();
}

}  // namespace troupe
