#pragma once
// The gate in front of CAF's BASP: no byte from a peer that has not proved
// it knows the cluster secret ever reaches CAF's network parser.
//
// Why: CAF 0.17's BASP broker trusts the wire. It sizes its read buffer from
// a header's payload_len before anything else runs (one 32-byte header can
// make a node allocate 4 GiB), it keeps connections that never send a whole
// header, and it hands its node id to anyone who connects, so a stranger
// can send a client handshake claiming a worker's node id and take over the
// routes to it. troupe's own handshake (config/secret.hpp) used to run over
// BASP, i.e. after all of that.
//
// So a node no longer lets CAF listen. The gate owns the listening socket
// and, on a thread of its own, runs a fixed-size exchange on each new
// connection (every frame has one length, known before reading; nothing is
// allocated from a peer's bytes):
//
//   listener -> connector  hello: magic "troupeG2", challenge S          (72 bytes)
//   connector -> listener  proof: magic, name C, target T, challenge C,
//                          HMAC(K, "gate-client" S C T, C)               (264 bytes)
//   listener -> connector  verdict: magic, V = 'A' or 'R', name L,
//                          HMAC(K, "gate-server" C S V, L)               (137 bytes)
//
// K = derive_key(secret, key_purpose::gate) (config/secret.hpp): never the
// raw secret, and not the node handshake's key, so neither protocol can be
// used to make a node sign something valid in the other. Both sides prove K
// (challenge_response, with a label per direction, so a proof of one
// direction is never valid for the other). T is the task the connector
// dialed (gate_options::expect_peer; empty: any, as the rendezvous): the
// listener refuses a proof for another task than itself, so a proof cannot
// be relayed from a squatted port to another node, and a name outside
// gate_options::allowed_peers; the connector refuses a verdict whose MAC'd
// name L is not T. A BASP listener also closes, without a verdict, a
// proof from a task that has a live connection to this process already
// (net/basp_guard.hpp): with the pre-shared key any holder of the
// secret can prove any task's name, but not take a live one (with
// certificates, from cluster.tls or the job CA of net/job_ca.hpp, the
// connector also proves the name with its certificate before the verdict,
// gate_options::certificate_proof, and the TLS link checks it again); the connector
// retries it like a listener that went away. Refusals are MAC'd too: a connector treats only a
// refusal that proves K as final; garbage, a bad MAC or an unproven refusal is `unreachable`
// (retried until the caller's deadline), since anyone may sit on a port. Only after an 'A' is the
// socket handed to the BASP broker: as a new incoming connection on the listener's side, as a
// connect on the connector's side. From there on it is BASP between two authenticated processes,
// inside TLS 1.3 and behind the frame guard (net/secure_link.hpp).
//
// Limits before authentication: at most `max_pending` connections, at most
// half of them from one address, and at most a quarter of the descriptor
// limit; a new one beyond that, or one that finds the process out of
// descriptors, evicts the oldest that has sent nothing, else one at random,
// so neither idle connections nor partial proofs lock real peers out. At
// most 32 accepts per turn of the loop, after the pending proofs are read.
// Each is closed after `handshake_timeout`. An admission is logged at info;
// a refused or timed-out connection is logged with the peer's address, at
// most one line a second (the rest counted in the next line). If the gate's
// thread fails, it closes the listener and calls `on_failure`.
#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "net/secure_link.hpp"

namespace troupe {

// A listener that cannot be opened (address in use, bad host); what() names
// the address.
class gate_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A connection that proved the secret, as a plain socket (non-blocking),
// for a protocol of troupe's own after the gate's exchange rather than BASP
// (the rendezvous at the chief, net/rendezvous.hpp; the chief's enrolment
// desk, net/chief_enrol.hpp). `name` is the task the peer proved it is,
// `peer` its "host:port". The receiver owns `fd`.
using gate_admit_handler =
    std::function<void(int fd, const std::string& name, const std::string& peer)>;

struct gate_options {
  std::string secret;  // the cluster secret (config/secret.hpp)
  std::string name;    // this process's task, e.g. "chief:0" (at most 63 bytes)
  std::chrono::milliseconds handshake_timeout{5000};
  std::size_t max_pending = 64;
  // What runs on an admitted connection (net/secure_link.hpp): TLS 1.3
  // keyed from `secret` unless it says otherwise (a psk_key left empty is
  // derived from `secret`).
  link_security link;
  // Connector: the task it dials, whose name the proof carries and MACs and
  // the verdict must bear (empty: any, e.g. the rendezvous). Listener: unused.
  std::string expect_peer;
  // Listener: the only tasks it admits (empty: any).
  std::set<std::string> allowed_peers;
  // Listener: a second name this gate answers to (e.g. "chief:0/enrol"). A
  // proof aimed at it is admitted, under the same limits and checks (a live
  // task is refused), to `on_side_door` over TLS keyed from `secret`
  // instead of BASP: the chief's enrolment desk (net/chief_enrol.hpp),
  // reached before the task holds the certificate its links need. Empty:
  // no side door.
  std::string side_door;
  // Listener: called (on the gate's thread, after the listener is closed)
  // when the gate stops on an error, with why.
  std::function<void(const std::string&)> on_failure;
  // Tests: called at the start of each turn of the gate's loop.
  std::function<void()> on_turn;
  gate_admit_handler on_side_door;  // with side_door
  // Certificates (set by with_link_key, with or without a secret): after its
  // proof the connector sends its certificate and a signature over the
  // exchange (gate_wire::make_certificate_proof), and the listener admits
  // only a certificate of its CA naming the connector, before any TLS state.
  bool certificate_proof = false;
};

// `opts` with the key its link needs, for both sides of the gate: a psk
// link without its key takes it from the secret; certificates run the
// exchange with the certificate proof, keyed from the secret or, without
// one, from their CA's certificate (certificates_only_secret).
gate_options with_link_key(gate_options opts);

// What the listener has seen; counters only grow.
struct gate_stats {
  uint64_t admitted = 0;   // proved the secret, handed to BASP
  uint64_t refused = 0;    // wrong proof, bad frame, or closed mid-handshake
  uint64_t timed_out = 0;  // no full proof within handshake_timeout
  uint64_t evicted = 0;    // dropped to make room (max_pending)
};

// The listening side: serves `whom` (its message interface `ifs`) to every
// peer that passes the gate, as CAF's publish does for every peer.
class gate {
 public:
  // Listens on host:port (port 0: one the OS picks); throws gate_error.
  gate(caf::actor_system& sys, caf::strong_actor_ptr whom, std::set<std::string> ifs,
       const std::string& host, uint16_t port, gate_options opts);
  // Hands each admitted connection to `on_admitted` (on the gate's thread)
  // instead of BASP: the same exchange, limits and logging in front.
  gate(const std::string& host, uint16_t port, gate_options opts, gate_admit_handler on_admitted);
  ~gate();  // stops listening; connections already handed to BASP stay
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;

  uint16_t port() const { return port_; }
  gate_stats stats() const;
  // Stops serving and hands over the listening socket, still listening with
  // its backlog, instead of closing it (the rendezvous keeps the chief's
  // port for its node's gate); -1 when the gate stopped on an error.
  int release_listener();

 private:
  struct state;
  void stop_thread();
  void start(const std::string& host, uint16_t port, gate_options opts);
  void loop();
  void serve();

  std::unique_ptr<state> st_;
  uint16_t port_ = 0;
  std::thread thread_;
};

template <class Handle>
std::unique_ptr<gate> open_gate(caf::actor_system& sys, const Handle& whom, const std::string& host,
                                uint16_t port, gate_options opts) {
  return std::make_unique<gate>(sys, caf::actor_cast<caf::strong_actor_ptr>(whom),
                                sys.message_types<Handle>(), host, port, std::move(opts));
}

// Listening sockets kept between the rendezvous and the node's gate, so that
// the address a process announced stays its own until its gate listens
// there: a gate for host:port takes the socket held for them, if any,
// instead of binding anew (a port given back to the OS in between could be
// taken by anyone).
namespace held_listeners {
// Listens at host:port now (port 0: one the OS picks) and keeps the socket;
// returns its port. Throws gate_error naming the address.
uint16_t hold(const std::string& host, uint16_t port);
// Keeps `fd`, listening at host:port, for the next gate there.
void keep(const std::string& host, uint16_t port, int fd);
// The socket held for host:port (the caller owns it), or -1.
int take(const std::string& host, uint16_t port);
}  // namespace held_listeners

// The connecting side's outcome.
struct gate_connection {
  caf::strong_actor_ptr actor;  // the listener's actor; null on failure
  bool unreachable = false;     // nobody listening (yet): worth retrying
  std::string error;            // why not, e.g. "chief:0 refused this process's proof ..."
};

// The connecting side's exchange alone: the authenticated socket (blocking
// mode off) in the clear, or fd -1 with `error` and `unreachable` as above.
struct gate_socket {
  int fd = -1;
  std::string peer;  // the listener's task, once it proved the secret
  // The exchange's two challenges: the TLS session after it is bound to them
  // (net/secure_link.hpp).
  std::string server_challenge, client_challenge;
  bool unreachable = false;
  std::string error;
};
gate_socket gate_handshake(const std::string& host, uint16_t port, const gate_options& opts,
                           caf::timespan timeout);
// The exchange, then TLS (opts.link) on the socket: `fd` is the plain end
// of the link (net/secure_link.hpp), for a protocol of troupe's own.
gate_socket gate_secure_handshake(const std::string& host, uint16_t port, const gate_options& opts,
                                  caf::timespan timeout);

// Connects to a gate at host:port, runs the exchange within `timeout`, then
// lets BASP connect over the same socket; checks the actor's interface
// against `ifs`.
gate_connection gate_connect(caf::actor_system& sys, const std::string& host, uint16_t port,
                             const gate_options& opts, const std::set<std::string>& ifs,
                             caf::timespan timeout);

template <class Handle>
caf::expected<Handle> gate_remote_actor(caf::actor_system& sys, const std::string& host,
                                        uint16_t port, const gate_options& opts,
                                        caf::timespan timeout, bool* unreachable = nullptr) {
  auto c = gate_connect(sys, host, port, opts, sys.message_types<Handle>(), timeout);
  if (unreachable) *unreachable = c.unreachable;
  if (!c.actor) return caf::make_error(caf::sec::cannot_connect_to_node, std::move(c.error));
  return caf::actor_cast<Handle>(std::move(c.actor));
}

// The exchange's frames (net/gate_wire.cpp: no sockets, no CAF), for
// both sides, the tests and the fuzz target.
namespace gate_wire {
inline constexpr std::size_t kMagicBytes = 8;
inline constexpr std::size_t kNameBytes = 64;
inline constexpr std::size_t kHexBytes = 64;
inline constexpr std::size_t kHelloBytes = kMagicBytes + kHexBytes;
inline constexpr std::size_t kProofBytes = kMagicBytes + 2 * kNameBytes + 2 * kHexBytes;
inline constexpr std::size_t kVerdictBytes = kMagicBytes + 1 + kNameBytes + kHexBytes;
inline constexpr char kMagic[kMagicBytes + 1] = "troupeG2";

// The listener's first frame, and the connector's reading of it: the
// challenge, or empty when the frame is not a gate's hello.
std::string make_hello(const std::string& server_challenge);
std::string check_hello(std::string_view frame);

// `key` below is the gate's key, derive_key(secret, key_purpose::gate), never
// the raw secret.

// The connector `name`'s proof for the listener's hello `server_challenge`,
// aimed at the task `target` (empty: any).
std::string make_proof(const std::string& key, const std::string& name, const std::string& target,
                       const std::string& server_challenge, const std::string& client_challenge);
// The listener's check of a proof frame.
struct proof_check {
  std::string name;    // the connector's task, once its MAC checked out
  std::string target;  // the task it dialed (empty: any), idem
  // Its challenge as sent, once the frame is well formed, MAC or not: a
  // refusal is MAC'd over it either way.
  std::string client_challenge;
  bool well_formed = false;  // the frame parsed; `problem` may still be the MAC
  std::string problem;       // empty: the MAC checked out; else why not
};
proof_check check_proof(const std::string& key, const std::string& server_challenge,
                        std::string_view frame);

// The listener `name`'s answer, admitted or refused, MAC'd either way.
std::string make_verdict(bool admitted, const std::string& key, const std::string& name,
                         const std::string& server_challenge, const std::string& client_challenge);
// The connector's check of it.
struct verdict_check {
  std::string name;        // the listener's task, when the verdict is authentic
  std::string problem;     // empty: trusted; else what is wrong ("refused this process: ...")
  bool authentic = false;  // the verdict (admitted or refused) is MAC'd by the key
};
verdict_check check_verdict(const std::string& key, const std::string& server_challenge,
                            const std::string& client_challenge, std::string_view frame);
// Whether a connector's error says it was refused, the secret failed or TLS
// did, rather than that nobody answered: a caller that retries until its
// deadline names such an error then, as the likelier cause.
bool names_refusal(std::string_view error);

// The certificate proof (gate_options::certificate_proof), after the proof
// frame: magic "troupeC1", the certificate's and the signature's lengths
// (2 bytes each, big-endian), the connector's certificate (DER), its
// signature over certificate_transcript with the certificate's key.
inline constexpr std::size_t kCertHeaderBytes = kMagicBytes + 4;
inline constexpr std::size_t kMaxCertBytes = 8192;
inline constexpr std::size_t kMaxCertSignatureBytes = 1024;
inline constexpr char kCertMagic[kMagicBytes + 1] = "troupeC1";
std::string certificate_transcript(const std::string& server_challenge,
                                   const std::string& client_challenge, const std::string& name,
                                   const std::string& target);
std::string make_certificate_proof(std::string_view certificate, std::string_view signature);
// The bytes after the header that it announces, or -1 when it is no
// certificate proof's header or a length is 0 or over its limit.
int64_t certificate_proof_length(std::string_view header);
// A whole proof's certificate and signature; nullopt unless its header is a
// certificate proof's and the frame holds exactly what that announces.
struct certificate_proof_parts {
  std::string_view certificate, signature;
};
std::optional<certificate_proof_parts> split_certificate_proof(std::string_view frame);
}  // namespace gate_wire

// The certificate proof's cryptography (net/gate_certificate.cpp).
namespace gate_certificate {
// The connector's frame: the certificate of `sec` (its cert_file or job CA
// identity) and its signature over `transcript`; throws link_error naming
// the file.
std::string make_proof(const link_security& sec, std::string_view transcript);
// The listener's check of a whole frame: "" when the certificate is of the
// CA `sec` trusts, names `name` and signed `transcript`; else why not.
std::string check_proof(const link_security& sec, std::string_view frame,
                        std::string_view transcript, const std::string& name);
}  // namespace gate_certificate

}  // namespace troupe
