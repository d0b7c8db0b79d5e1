#pragma once
// What the files of the TLS links share (net/secure_link.cpp: the hub
// thread that runs every handshake, and the API; net/tls_context.cpp:
// OpenSSL's contexts and callbacks; net/link_pumps.cpp: the two threads
// that move an open link's bytes). Not for use outside them.
#include <openssl/ssl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "crypto/crypto.hpp"
#include "net/basp_guard.hpp"
#include "net/secure_link.hpp"
#include "net/tls_records.hpp"

namespace troupe::secure_link_detail {

using clock_type = std::chrono::steady_clock;

// The process's link counters (link_totals()).
struct link_counters {
  std::atomic<uint64_t> opened{0}, failed{0}, guard_closed{0}, dropped{0}, bytes_in{0},
      bytes_out{0}, key_updates{0}, evicted{0};
};

// One connection: the peer's socket (with its TLS session) and the plain end
// of the socketpair whose other end BASP (or the rendezvous) reads. The hub
// thread runs its handshake; then two threads of its own move its bytes,
// one per direction, each with its own half of the TLS 1.3 record layer
// (net/tls_records.hpp), so encryption and decryption run side by side.
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

// OpenSSL's queued errors as one line (and the queue emptied).
std::string ssl_errors();

struct ctx_free {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using ctx_ptr = std::unique_ptr<SSL_CTX, ctx_free>;

// The TLS 1.3 context for `sec` (psk or certificates, with the callbacks
// that key a link); throws link_error naming a bad certificate file.
ctx_ptr make_context(const link_security& sec);
// One context serves every link with the same `sec`: its key in the cache.
std::string context_key(const link_security& sec);
// SHA-256 (hex) of the DER bytes of the CA certificates `sec` trusts (its
// ca_file, or the job CA's); throws link_error naming the file.
std::string ca_certificates_digest(const link_security& sec);
// Whether `cert` names `task`: subject CN, or a DNS or URI alternative name.
bool certificate_names(X509* cert, const std::string& task);

// Peer -> BASP: records opened, frames checked by the guard, written to the
// plain end. Ends when the peer closes or misbehaves, or the link stops.
void pump_inbound(link& l, link_counters& counters);
// BASP -> peer: what BASP writes, sealed into records and sent. When BASP
// closes its end, what is left goes out with a close_notify. `pending`: the
// handshake's last flight, if the socket had not taken it all.
void pump_outbound(link& l, link_counters& counters, std::vector<char> pending);

}  // namespace troupe::secure_link_detail
