#include "runtime/secure_link.hpp"

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
#include "runtime/basp_guard.hpp"
#include "runtime/fork_join_pool.hpp"
#include "runtime/frame_budget.hpp"
#include "runtime/tls_records.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::size_t kChunk = 256 * 1024;         // one read from either side
constexpr auto kLinger = std::chrono::seconds(2);  // to flush after the other side closed
constexpr const char* kCutByBudget = "cut for the budget of unfinished frames";

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

// The process's link counters (link_totals()).
struct link_counters {
  std::atomic<uint64_t> opened{0}, failed{0}, guard_closed{0}, dropped{0}, bytes_in{0},
      bytes_out{0}, key_updates{0}, evicted{0};
};

// One connection: the peer's socket (with its TLS session) and the plain end
// of the socketpair whose other end BASP (or the rendezvous) reads. The hub
// thread runs its handshake; then two threads of its own move its bytes,
// one per direction, each with its own half of the TLS 1.3 record layer
// (runtime/tls_records.hpp), so encryption and decryption run side by side.
struct link {
  int tcp = -1;
  int plain = -1;
  SSL* ssl = nullptr;  // null: insecure
  link_params p;
  std::string psk;  // this connection's pre-shared key
  std::string psk_problem;
  // The application traffic secrets, from OpenSSL's key log as the
  // handshake derives them; wiped (and the SSL freed) once the record
  // layer below is keyed from them.
  std::string client_secret, server_secret;
  // This end's two halves of the record layer (null: insecure).
  std::unique_ptr<tls13::record_writer> writer;
  std::unique_ptr<tls13::record_reader> reader;
  uint64_t records_per_key = tls13::default_records_per_key;  // the writer's
  uint64_t unfinished_limit = 0;  // the process's budget for unfinished frames
  // From the inbound thread to the outbound one: the alert owed to the
  // peer for a bad record (-1: none), and a peer's request for new keys.
  std::atomic<int> alert_due{-1};
  std::atomic<bool> key_update_asked{false};
  std::unique_ptr<basp_guard> guard;
  std::promise<std::string> ready;
  std::atomic<bool> decided{false};
  bool started = false;  // serviced once (the connector's hello goes out then)
  bool open = false;     // the TLS handshake is done and the peer checked
  bool done = false;     // the handshake failed: the hub drops it
  clock_type::time_point deadline;
  long long timeout_ms = 0;
  // TLS records OpenSSL wrote during the handshake (into a memory BIO),
  // waiting for the socket.
  BIO* wbio = nullptr;  // owned by `ssl`
  std::vector<char> wire;
  std::size_t wire_off = 0;
  // Once open: the two directions' threads, and a pipe that wakes both when
  // either ends (the link ends as a whole).
  std::thread inbound, outbound;
  int stop_pipe[2] = {-1, -1};
  std::atomic<bool> stopping{false};
  std::atomic<int> running{0};

  ~link() {
    if (inbound.joinable()) inbound.join();
    if (outbound.joinable()) outbound.join();
    if (ssl) SSL_free(ssl);
    forget_keys();
    for (int fd : {tcp, plain, stop_pipe[0], stop_pipe[1]})
      if (fd >= 0) ::close(fd);
  }
  // Wipes the pre-shared key and the traffic secrets (the record layer and
  // OpenSSL keep their own copies, wiped when they are freed).
  void forget_keys() {
    crypto::cleanse(psk);
    crypto::cleanse(client_secret);
    crypto::cleanse(server_secret);
  }
  std::size_t pending_wire() const { return wire.size() - wire_off; }
  std::string who() const { return p.peer_task + " (" + p.peer_address + ")"; }
  // The first answer wins: "" ready, else why not.
  void decide(const std::string& why) {
    if (!decided.exchange(true)) ready.set_value(why);
  }
  void stop() {
    if (stopping.exchange(true)) return;
    char b = 1;
    [[maybe_unused]] auto n = ::write(stop_pipe[1], &b, 1);
  }
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

// OpenSSL hands every secret the handshake derives to its key log; a link
// keeps the two application traffic secrets (never written anywhere) to
// key its record layer.
void keep_traffic_secret(const SSL* ssl, const char* line) {
  // (Nothing here may throw: OpenSSL's C frames are below. The line is
  // OpenSSL's, wiped by it after this call: no copy of it is made.)
  auto* l = link_of(const_cast<SSL*>(ssl));
  if (!l) return;
  const std::string_view text(line);
  std::string* slot = nullptr;
  if (text.starts_with("CLIENT_TRAFFIC_SECRET_0 "))
    slot = &l->client_secret;
  else if (text.starts_with("SERVER_TRAFFIC_SECRET_0 "))
    slot = &l->server_secret;
  if (!slot) return;
  long len = 0;
  unsigned char* bytes = OPENSSL_hexstr2buf(line + text.rfind(' ') + 1, &len);
  crypto::cleanse(*slot);
  if (bytes) slot->assign(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(len));
  OPENSSL_clear_free(bytes, static_cast<std::size_t>(len));
}

ctx_ptr make_context(const link_security& sec) {
  ERR_clear_error();
  ctx_ptr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) throw link_error("TLS: cannot create a context: " + ssl_errors());
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION);
  // The record layer after the handshake is ours (runtime/tls_records.hpp),
  // for this suite: AES-GCM runs in hardware on every x86 CPU we target.
  SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256");
  // Nothing after the handshake: no tickets (a NewSessionTicket would be a
  // record of the application keys that OpenSSL, not our layer, sent).
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // No read-ahead: OpenSSL reads the handshake record by record and stops
  // at its end, so the first application record is still in the socket
  // for our layer.
  SSL_CTX_set_read_ahead(c, 0);
  SSL_CTX_set_keylog_callback(c, keep_traffic_secret);
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

// Blocks SIGPIPE on the calling thread: a write to a peer that vanished then
// fails with EPIPE and the link closes, instead of ending the process.
void block_sigpipe() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

// Waits until `fd` is ready for `events` or the link is told to stop (false
// then), at most until `until` when given.
bool wait_for(link& l, int fd, short events,
              std::optional<clock_type::time_point> until = std::nullopt) {
  while (!l.stopping) {
    pollfd fds[2] = {{fd, events, 0}, {l.stop_pipe[0], POLLIN, 0}};
    int ms = -1;
    if (until) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*until - clock_type::now());
      if (left.count() <= 0) return false;
      ms = static_cast<int>(left.count());
    }
    int r = ::poll(fds, 2, ms);
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents != 0) return false;
    if (r > 0) return true;
  }
  return false;
}

// Sends all of [data, data + n) to `fd`; false when the link stops, the
// deadline passes or the socket fails.
bool send_all(link& l, int fd, const char* data, std::size_t n,
              std::optional<clock_type::time_point> until = std::nullopt) {
  while (n > 0) {
    ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
    if (k > 0) {
      data += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!wait_for(l, fd, POLLOUT, until)) return false;
      continue;
    }
    return false;
  }
  return true;
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

  void wake() {
    char b = 1;
    [[maybe_unused]] auto n = ::write(wake_[1], &b, 1);
  }

 private:
  link_hub() {
    // OpenSSL's own exit handler is registered now, before this hub's
    // destructor is: at exit the hub (its threads, its contexts) goes
    // first, then OpenSSL's cleanup.
    OPENSSL_init_ssl(0, nullptr);
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw link_error(std::string("TLS links: pipe: ") + std::strerror(errno));
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
    ::close(wake_[0]);
    ::close(wake_[1]);
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
  int wake_[2] = {-1, -1};
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
  std::vector<pollfd> fds;
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
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    auto now = clock_type::now();
    evict_excess_handshakes(now);
    auto next = now + std::chrono::seconds(1);
    for (auto& l : links_) {
      fds.push_back(
          {l->tcp, static_cast<short>(POLLIN | (l->pending_wire() > 0 ? POLLOUT : 0)), 0});
      next = std::min(next, l->deadline);
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0)));
    char drain[64];
    while (::read(wake_[0], drain, sizeof drain) > 0) {
    }
    now = clock_type::now();
    for (std::size_t i = 0; i < links_.size(); ++i) {
      auto& l = *links_[i];
      if (l.done) continue;  // evicted
      // A new link's first handshake step sends its hello unprompted.
      if (fds[1 + i].revents != 0 || !l.started) {
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

// The n wire bytes at `in` opened into `out`; n becomes the plaintext's
// size. "" or why the link ends (with the alert owed noted for the
// outbound side, which owns the writer).
std::string open_records(link& l, tls13::record_reader& records, const char* in, std::size_t& n,
                         char* out) {
  std::size_t got = 0;
  if (auto problem = records.feed_to(in, n, out, &got); !problem.empty()) {
    if (auto owed = records.alert()) l.alert_due = *owed;
    return "TLS: " + problem;  // a record that fails authentication lands here
  }
  if (records.take_key_update_request()) l.key_update_asked = true;
  n = got;
  return "";
}

// The guard's check of the n bytes at `data`, within the process's budget
// for unfinished frames; data and n become what passed (in `checked`): whole
// frames only. "" or why the link ends; kCutByBudget when the budget cut
// it (its callback logged why).
std::string check_frames(link& l, link_counters& counters, frame_budget::share& budget,
                         const char*& data, std::size_t& n, std::vector<char>& checked) {
  // A large frame's buffer, handed on, is not kept for the next chunk.
  if (checked.capacity() > basp_guard::kKeptBytes)
    std::vector<char>().swap(checked);
  else
    checked.clear();
  auto& process = frame_budget::process();
  if (!process.reserve(budget, n, l.unfinished_limit, [&l] { return !l.stopping; }).empty())
    return kCutByBudget;
  auto problem = l.guard->feed(data, n, checked);
  process.settle(budget, l.guard->held_bytes());
  if (auto drops = l.guard->take_drops(); drops.count > 0) {
    counters.dropped += drops.count;
    spdlog::warn("{}: dropped {} frame(s) from {}: {}", l.p.me, drops.count, l.who(),
                 drops.first_reason);
  }
  if (!problem.empty()) {
    ++counters.guard_closed;
    return problem;
  }
  data = checked.data();
  n = checked.size();
  return "";
}

// Peer -> BASP: records opened, frames checked by the guard, written to the
// plain end. Ends when the peer closes or misbehaves, or the link stops.
void pump_inbound(link& l, link_counters& counters) {
  tls13::record_reader* records = l.reader.get();
  // Record plaintext goes straight into `opened` (never zero-filled): at
  // most what came in, plus a record left over from the last read.
  std::vector<char> buf(kChunk), checked;
  std::unique_ptr<char[]> opened(
      records ? new char[kChunk + tls13::header_size + tls13::max_ciphertext] : nullptr);
  std::string why;
  bool peer_closed = false, basp_gone = false;
  frame_budget::share budget(frame_budget::process(), l.who(), [&l](const std::string& reason) {
    spdlog::warn("{}: closed the connection with {}: {}", l.p.me, l.who(), reason);
    l.stop();
  });
  while (!l.stopping && !peer_closed) {
    ssize_t n = ::recv(l.tcp, buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (!wait_for(l, l.tcp, POLLIN)) break;
        continue;
      }
      why = std::strerror(errno);
      break;
    }
    if (n == 0) {
      peer_closed = true;
      break;
    }
    const char* data = buf.data();
    std::size_t len = static_cast<std::size_t>(n);
    if (records) {
      why = open_records(l, *records, buf.data(), len, opened.get());
      if (!why.empty()) break;
      peer_closed = records->closed();
      data = opened.get();
    }
    if (len == 0) continue;
    counters.bytes_in += len;
    l.decide({});
    if (l.guard) {
      why = check_frames(l, counters, budget, data, len, checked);
      if (why == kCutByBudget) why.clear();  // logged as it was cut
      if (!why.empty() || l.stopping) break;
    }
    if (!send_all(l, l.plain, data, len)) {  // BASP went away, or the link stops
      basp_gone = !l.stopping;
      break;
    }
  }
  if (!why.empty()) {
    spdlog::warn("{}: closed the connection with {}: {}", l.p.me, l.who(), why);
    l.decide(why);
  } else if (peer_closed) {
    l.decide("the peer closed the connection after the TLS handshake");
  }
  if (records) counters.key_updates += records->key_updates();
  // BASP closing its end may leave its last messages (a chief's stop to its
  // tasks) unread in the socketpair: the outbound side sends them, reads the
  // end, and ends the link then.
  if (!basp_gone) l.stop();
}

// The alert the inbound side found owed (a record that failed), sealed and
// sent if the socket takes it now: best effort, the link is ending.
void send_owed_alert(link& l) {
  const int owed = l.alert_due.exchange(-1);
  if (owed < 0 || !l.writer || l.writer->failed()) return;
  std::vector<char> alert;
  l.writer->seal_alert(static_cast<unsigned char>(owed), alert);
  [[maybe_unused]] auto n = ::send(l.tcp, alert.data(), alert.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// BASP -> peer: what BASP writes, sealed into records and sent. When BASP
// closes its end, what is left goes out (within kLinger) with a
// close_notify.
void pump_outbound(link& l, link_counters& counters, std::vector<char> pending) {
  tls13::record_writer* records = l.writer.get();
  // The handshake's last flight first, if the socket had not taken it all.
  if (!pending.empty() && !send_all(l, l.tcp, pending.data(), pending.size())) return l.stop();
  std::vector<char> buf(kChunk);
  // Records are sealed straight into `wire` (never zero-filled).
  std::unique_ptr<char[]> wire(records ? new char[records->max_sealed_size(kChunk)] : nullptr);
  while (!l.stopping) {
    ssize_t n = ::recv(l.plain, buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (!wait_for(l, l.plain, POLLIN)) break;
        continue;
      }
      break;
    }
    if (n == 0) {  // BASP closed this connection: say so, then end
      if (records) {
        std::vector<char> close_notify;
        records->seal_close_notify(close_notify);
        send_all(l, l.tcp, close_notify.data(), close_notify.size(), clock_type::now() + kLinger);
      }
      ::shutdown(l.tcp, SHUT_WR);
      break;
    }
    const auto len = static_cast<std::size_t>(n);
    bool sent;
    if (records) {
      if (l.key_update_asked.exchange(false)) records->request_key_update();
      // Sealed records go out while the ones after them are sealed.
      std::size_t gone = 0;
      sent = true;
      records->seal_to(buf.data(), len, wire.get(), [&](std::size_t ready) {
        if (sent && ready > gone) sent = send_all(l, l.tcp, wire.get() + gone, ready - gone);
        gone = ready;
      });
    } else {
      sent = send_all(l, l.tcp, buf.data(), len);
    }
    if (!sent) break;
    counters.bytes_out += len;
  }
  send_owed_alert(l);
  if (records) counters.key_updates += records->key_updates();
  l.stop();
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
