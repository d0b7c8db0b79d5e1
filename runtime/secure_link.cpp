#include "runtime/secure_link.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "config/cluster.hpp"
#include "config/secret.hpp"
#include "runtime/basp_guard.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::size_t kChunk = 256 * 1024;         // one read from either side
constexpr std::size_t kHighWater = 2 << 20;        // buffered per direction before reading stops
constexpr std::size_t kMaxWrite = 1 << 20;         // one SSL_write
constexpr auto kLinger = std::chrono::seconds(2);  // to flush after the other side closed

std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

struct ctx_free {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using ctx_ptr = std::unique_ptr<SSL_CTX, ctx_free>;

// One connection: the peer's socket (with its TLS session) and the plain end
// of the socketpair whose other end BASP (or the rendezvous) reads.
struct link {
  int tcp = -1;
  int plain = -1;
  SSL* ssl = nullptr;  // null: insecure
  link_params p;
  std::string psk;  // this connection's pre-shared key
  std::string psk_problem;
  std::unique_ptr<basp_guard> guard;
  std::promise<std::string> ready;
  bool decided = false;
  bool started = false;  // serviced once (the connector's hello goes out then)
  bool open = false;     // the TLS handshake is done and the peer checked
  bool done = false;
  clock_type::time_point deadline;
  long long timeout_ms = 0;
  std::vector<char> in;  // peer -> plain
  std::size_t in_off = 0;
  std::vector<char> out;  // plain -> peer
  std::size_t out_off = 0;
  // TLS records OpenSSL wrote (into a memory BIO), waiting for the socket:
  // one send() for many 16 KiB records rather than one each.
  BIO* wbio = nullptr;  // owned by `ssl`
  std::vector<char> wire;
  std::size_t wire_off = 0;
  bool read_stopped_full = false;  // reading stopped with `in` full, not for want of bytes
  bool peer_gone = false;          // the peer closed: flush `in`, then end
  bool plain_gone = false;         // BASP closed: flush `out`, then end
  clock_type::time_point linger_until;

  ~link() {
    if (ssl) SSL_free(ssl);
    for (int fd : {tcp, plain})
      if (fd >= 0) ::close(fd);
  }
  std::size_t pending_in() const { return in.size() - in_off; }
  std::size_t pending_out() const { return out.size() - out_off; }
  std::size_t pending_wire() const { return wire.size() - wire_off; }
  std::string who() const { return p.peer_task + " (" + p.peer_address + ")"; }
};

link* link_of(SSL* ssl) {
  return static_cast<link*>(SSL_get_app_data(ssl));
}

// A TLS 1.3 session carrying an external PSK (the way OpenSSL takes one).
SSL_SESSION* psk_session(SSL* ssl, const std::string& key) {
  static const unsigned char aes128gcm_sha256[] = {0x13, 0x01};
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, aes128gcm_sha256);
  SSL_SESSION* s = cipher ? SSL_SESSION_new() : nullptr;
  if (!s) return nullptr;
  if (!SSL_SESSION_set1_master_key(s, reinterpret_cast<const unsigned char*>(key.data()),
                                   key.size()) ||
      !SSL_SESSION_set_cipher(s, cipher) || !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

// The connector offers its link's key under its own task's name.
int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* id_len,
            SSL_SESSION** session) {
  *session = nullptr;
  auto* l = link_of(ssl);
  if (!l) return 0;
  SSL_SESSION* s = psk_session(ssl, l->psk);
  if (!s) return 0;
  if (md && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
    SSL_SESSION_free(s);  // a hash this key is not for: offer nothing
    return 1;
  }
  *id = reinterpret_cast<const unsigned char*>(l->p.me.data());
  *id_len = l->p.me.size();
  *session = s;
  return 1;
}

// The listener finds the key only for the task its gate admitted.
int find_psk(SSL* ssl, const unsigned char* id, size_t id_len, SSL_SESSION** session) {
  *session = nullptr;
  auto* l = link_of(ssl);
  if (!l) return 0;
  std::string identity(reinterpret_cast<const char*>(id), id_len);
  if (identity != l->p.peer_task) {
    l->psk_problem =
        "its TLS identity '" + identity.substr(0, 64) + "' is not the task that passed the gate";
    return 1;  // no key: the handshake fails
  }
  *session = psk_session(ssl, l->psk);
  return *session ? 1 : 0;
}

// Whether `cert` names `task`: subject CN, or a DNS or URI alternative name.
bool certificate_names(X509* cert, const std::string& task) {
  char cn[256] = {};
  int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  if (n > 0 && std::string(cn, static_cast<std::size_t>(n)) == task) return true;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  bool found = false;
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names) && !found; ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(names, i);
    const ASN1_IA5STRING* s = g->type == GEN_DNS   ? g->d.dNSName
                              : g->type == GEN_URI ? g->d.uniformResourceIdentifier
                                                   : nullptr;
    if (s)
      found = std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                          static_cast<std::size_t>(ASN1_STRING_length(s))) == task;
  }
  GENERAL_NAMES_free(names);
  return found;
}

ctx_ptr make_context(const link_security& sec) {
  ERR_clear_error();
  ctx_ptr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) throw link_error("TLS: cannot create a context: " + ssl_errors());
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(c,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Read whole socket buffers, not a record header and then its body: half
  // the system calls. (Records read ahead are drained by the read loop.)
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, 64 * 1024);
  if (sec.kind == link_security::trust::psk) {
    SSL_CTX_set_psk_use_session_callback(c, use_psk);
    SSL_CTX_set_psk_find_session_callback(c, find_psk);
    SSL_CTX_set_verify(c, SSL_VERIFY_NONE, nullptr);
    return ctx;
  }
  auto bad = [](const char* key, const std::string& file) {
    return link_error("cluster.tls." + std::string(key) + " \"" + file + "\": " + ssl_errors());
  };
  if (SSL_CTX_load_verify_locations(c, sec.ca_file.c_str(), nullptr) != 1)
    throw bad("ca", sec.ca_file);
  if (SSL_CTX_use_certificate_chain_file(c, sec.cert_file.c_str()) != 1)
    throw bad("cert", sec.cert_file);
  if (SSL_CTX_use_PrivateKey_file(c, sec.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    throw bad("key", sec.key_file);
  if (SSL_CTX_check_private_key(c) != 1)
    throw link_error("cluster.tls.key \"" + sec.key_file + "\" does not match cluster.tls.cert \"" +
                     sec.cert_file + "\"");
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

std::string context_key(const link_security& sec) {
  if (sec.kind == link_security::trust::psk) return "psk";
  return sec.ca_file + '\0' + sec.cert_file + '\0' + sec.key_file;
}

// The thread that runs every link of this process.
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
    ++stats_opened_;
    wake();
  }

  link_stats totals() const {
    return {stats_opened_.load(),  stats_failed_.load(),   stats_guard_closed_.load(),
            stats_dropped_.load(), stats_bytes_in_.load(), stats_bytes_out_.load()};
  }

 private:
  link_hub() {
    // OpenSSL's own exit handler is registered now, before this hub's
    // destructor is: at exit the hub (its thread, its contexts) goes first,
    // then OpenSSL's cleanup.
    OPENSSL_init_ssl(0, nullptr);
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw link_error(std::string("TLS links: pipe: ") + std::strerror(errno));
    scratch_.resize(kChunk);
    thread_ = std::thread([this] {
      // OpenSSL writes with write(2): a peer that vanished would raise
      // SIGPIPE and end the process. Blocked on this thread, the write
      // fails with EPIPE instead, and the link closes.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      run();
      OPENSSL_thread_stop();
    });
  }
  ~link_hub() {
    stopping_ = true;
    wake();
    if (thread_.joinable()) thread_.join();
    links_.clear();
    incoming_.clear();
    contexts_.clear();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  void wake() {
    char b = 1;
    [[maybe_unused]] auto n = ::write(wake_[1], &b, 1);
  }

  void run();
  void service(link& l);
  void handshake(link& l);
  std::string check_peer(link& l);
  void fail(link& l, const std::string& why, bool handshake_failure);
  void decide(link& l, const std::string& why) {
    if (l.decided) return;
    l.decided = true;
    l.ready.set_value(why);
  }
  // > 0 bytes, 0 nothing now, -1 the peer closed or failed (l.done or
  // l.peer_gone set).
  long read_peer(link& l, char* buf, std::size_t len);
  void flush_plain(link& l);
  void read_plain(link& l);
  void flush_peer(link& l);
  // Moves what OpenSSL wrote to `wire` and sends what the socket takes.
  void send_wire(link& l);

  std::mutex mutex_;
  std::vector<std::unique_ptr<link>> incoming_;
  std::vector<std::unique_ptr<link>> links_;  // the hub thread's
  std::vector<char> scratch_;
  std::mutex ctx_mutex_;
  std::map<std::string, ctx_ptr> contexts_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  std::atomic<uint64_t> stats_opened_{0}, stats_failed_{0}, stats_guard_closed_{0},
      stats_dropped_{0}, stats_bytes_in_{0}, stats_bytes_out_{0};
};

void link_hub::run() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      for (auto& l : incoming_) links_.push_back(std::move(l));
      incoming_.clear();
    }
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    auto now = clock_type::now();
    auto next = now + std::chrono::seconds(1);
    for (auto& lp : links_) {
      auto& l = *lp;
      short tcp_events = 0, plain_events = 0;
      if (!l.open) {
        tcp_events = static_cast<short>(POLLIN | (l.pending_wire() > 0 ? POLLOUT : 0));
        next = std::min(next, l.deadline);
      } else {
        if (!l.peer_gone && l.pending_in() < kHighWater) tcp_events |= POLLIN;
        if (l.pending_wire() > 0 || (!l.ssl && l.pending_out() > 0)) tcp_events |= POLLOUT;
        if (l.pending_in() > 0) plain_events |= POLLOUT;
        if (!l.plain_gone && l.pending_out() < kHighWater) plain_events |= POLLIN;
        // Records OpenSSL has read ahead, left when `in` was full, do not
        // make the socket readable again.
        if (l.read_stopped_full && l.pending_in() < kHighWater) next = now;
        if (l.peer_gone || l.plain_gone) next = std::min(next, l.linger_until);
      }
      fds.push_back({l.tcp, tcp_events, 0});
      fds.push_back({l.plain, plain_events, 0});
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0)));
    char drain[64];
    while (::read(wake_[0], drain, sizeof drain) > 0) {
    }
    now = clock_type::now();
    for (std::size_t i = 0; i < links_.size(); ++i) {
      auto& l = *links_[i];
      const bool active = (fds[1 + 2 * i].revents | fds[2 + 2 * i].revents) != 0;
      // A new link's first handshake step sends its hello unprompted.
      if (active || !l.started || l.read_stopped_full) service(l);
      l.started = true;
      if (!l.done && !l.open && now >= l.deadline)
        fail(l, "no TLS handshake within " + std::to_string(l.timeout_ms) + " ms", true);
      if (!l.done && (l.peer_gone || l.plain_gone) &&
          (now >= l.linger_until || (l.peer_gone && l.pending_in() == 0) ||
           (l.plain_gone && l.pending_out() == 0 && l.pending_wire() == 0))) {
        if (l.plain_gone && l.ssl) {  // close_notify, best effort
          SSL_shutdown(l.ssl);
          send_wire(l);
        }
        l.done = true;
      }
    }
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [](const std::unique_ptr<link>& l) { return l->done; }),
                 links_.end());
  }
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
  if (handshake_failure) ++stats_failed_;
  send_wire(l);  // an alert OpenSSL wrote, best effort
  spdlog::warn("{}: closed the connection with {}: {}", l.p.me, l.who(), why);
  decide(l, why);
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
    decide(l, {});
    return;
  }
  ERR_clear_error();
  int r = SSL_do_handshake(l.ssl);
  if (r == 1) {
    if (auto problem = check_peer(l); !problem.empty()) return fail(l, problem, true);
    l.open = true;
    spdlog::debug("{}: TLS 1.3 with {} ({})", l.p.me, l.who(), SSL_get_cipher_name(l.ssl));
    // A TLS 1.3 client finishes before the server has checked its
    // certificate; BASP's listener speaks first, so its first bytes are the
    // verdict (a refusal arrives as an alert instead).
    if (l.p.listener || !l.guard) decide(l, {});
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

long link_hub::read_peer(link& l, char* buf, std::size_t len) {
  if (!l.ssl) {
    ssize_t n = ::recv(l.tcp, buf, len, 0);
    if (n > 0) return n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n == 0) {
      l.peer_gone = true;
      l.linger_until = clock_type::now() + kLinger;
    } else {
      fail(l, std::strerror(errno), false);
    }
    return -1;
  }
  ERR_clear_error();
  int n = SSL_read(l.ssl, buf, static_cast<int>(len));
  if (n > 0) return n;
  int e = SSL_get_error(l.ssl, n);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
  const bool eof = e == SSL_ERROR_ZERO_RETURN ||
                   (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) ||
                   (e == SSL_ERROR_SSL &&
                    ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING);
  if (eof) {
    l.peer_gone = true;  // close_notify, or the socket closed
    l.linger_until = clock_type::now() + kLinger;
    decide(l, "the peer closed the connection after the TLS handshake");
    return -1;
  }
  fail(l, "TLS: " + ssl_errors(), false);  // a record that fails authentication lands here
  return -1;
}

void link_hub::flush_plain(link& l) {
  while (l.pending_in() > 0) {
    ssize_t n = ::send(l.plain, l.in.data() + l.in_off, l.pending_in(), MSG_NOSIGNAL);
    if (n > 0) {
      l.in_off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    l.done = true;  // BASP went away; the link has nobody to deliver to
    return;
  }
  l.in.clear();
  l.in_off = 0;
}

void link_hub::read_plain(link& l) {
  while (!l.plain_gone && l.pending_out() < kHighWater) {
    ssize_t n = ::recv(l.plain, scratch_.data(), scratch_.size(), 0);
    if (n > 0) {
      l.out.insert(l.out.end(), scratch_.data(), scratch_.data() + n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    l.plain_gone = true;  // BASP closed this connection: flush, then close
    l.linger_until = clock_type::now() + kLinger;
  }
}

void link_hub::flush_peer(link& l) {
  while (l.pending_out() > 0 && !l.done) {
    const auto len = std::min(l.pending_out(), kMaxWrite);
    long n;
    if (l.ssl) {
      if (l.pending_wire() >= kHighWater) break;  // the socket is behind: wait for it
      ERR_clear_error();
      n = SSL_write(l.ssl, l.out.data() + l.out_off, static_cast<int>(len));
      if (n <= 0) {
        int e = SSL_get_error(l.ssl, static_cast<int>(n));
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) break;
        fail(l, "TLS: " + ssl_errors(), false);
        return;
      }
      send_wire(l);
    } else {
      n = ::send(l.tcp, l.out.data() + l.out_off, len, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (n < 0) {
        fail(l, std::strerror(errno), false);
        return;
      }
    }
    l.out_off += static_cast<std::size_t>(n);
    stats_bytes_out_ += static_cast<uint64_t>(n);
  }
  if (l.ssl) send_wire(l);
  if (l.pending_out() == 0) {
    l.out.clear();
    l.out_off = 0;
  }
}

void link_hub::service(link& l) {
  if (!l.open) {
    handshake(l);
    if (l.ssl && !l.done) send_wire(l);  // the handshake's flights
    if (!l.open || l.done) return;
  }
  // Peer -> BASP, through the guard.
  l.read_stopped_full = false;
  while (!l.done && !l.peer_gone) {
    if (l.pending_in() >= kHighWater) {
      l.read_stopped_full = true;
      break;
    }
    long n = read_peer(l, scratch_.data(), scratch_.size());
    if (n <= 0) break;
    decide(l, {});
    stats_bytes_in_ += static_cast<uint64_t>(n);
    if (!l.guard) {
      l.in.insert(l.in.end(), scratch_.data(), scratch_.data() + n);
      continue;
    }
    auto problem = l.guard->feed(scratch_.data(), static_cast<std::size_t>(n), l.in);
    if (auto drops = l.guard->take_drops(); drops.count > 0) {
      stats_dropped_ += drops.count;
      spdlog::warn("{}: dropped {} frame(s) from {}: {}", l.p.me, drops.count, l.who(),
                   drops.first_reason);
    }
    if (!problem.empty()) {
      ++stats_guard_closed_;
      return fail(l, problem, false);
    }
  }
  if (l.done) return;
  flush_plain(l);
  // BASP -> peer.
  read_plain(l);
  flush_peer(l);
  if (l.ssl && !l.done) send_wire(l);  // what reading wrote (a key update's answer)
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
  } else {
    if (secret.empty())
      throw link_error("cluster: TLS needs the cluster secret, or certificates in cluster.tls");
    s.psk_key = derive_key(secret, key_purpose::tls_psk);
  }
  return s;
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
      l->psk = hkdf_sha256(p.server_challenge + p.client_challenge, sec.psk_key, info, 32);
    }
  }
  if (!p.local_node.empty())
    l->guard = std::make_unique<basp_guard>(
        p.listener ? basp_guard::side::listener : basp_guard::side::connector, p.local_node,
        p.peer_task, sec.max_frame_bytes);
  l->deadline = clock_type::now() + sec.handshake_timeout;
  l->timeout_ms = sec.handshake_timeout.count();
  l->p = std::move(p);
  end.ready = l->ready.get_future().share();
  link_hub::instance().add(std::move(l));
  return end;
}

link_stats link_totals() {
  return link_hub::instance().totals();
}

}  // namespace troupe
