#pragma once
// Every byte between two troupe processes after the gate's exchange: TLS 1.3
// on the peer's socket, the BASP guard (net/basp_guard.hpp) on what comes
// out of it, and CAF's BASP broker on the other end of a socketpair.
//
//   peer ==TLS 1.3 over TCP==> inbound thread --guard--> socketpair ==> BASP
//   peer <==TLS 1.3 over TCP== outbound thread <-------- socketpair <== BASP
//
// Why threads of our own rather than CAF's openssl module: caf::openssl
// 0.17 has no pre-shared keys and no TLS 1.3 setting, it would parse BASP
// frames straight from the decrypted stream (the guard has to see every
// header first), and it reads exactly the bytes BASP asks for, so bytes
// already decrypted inside OpenSSL can wait for a socket event that never
// comes.
//
// One hub thread per process runs every link's handshake (OpenSSL, TLS 1.3
// only, TLS_AES_128_GCM_SHA256, no tickets). Then the link gets two threads,
// one per direction, each with its half of the record layer keyed from that
// direction's application traffic secret (net/tls_records.hpp, what
// kernel TLS does): encryption and decryption of one connection run side by
// side, where one SSL object would serialise them on one thread. The wire
// stays TLS 1.3 records.
//
// Two ways to trust (link_security::trust):
//   - psk (the default): the TLS 1.3 external pre-shared key is
//     HKDF(derive_key(secret, "tls"), salt = the gate's two challenges,
//     info = listener and connector task): fresh for each connection, bound
//     to the gate exchange that preceded it, never the secret itself; the
//     PSK identity is the connector's task. (EC)DHE is always mixed in
//     (psk_dhe_ke), so a later leak of the secret does not open recorded
//     traffic.
//   - certificates: mutual X.509 from a cluster CA; each side's certificate
//     must name its task (subject CN, or a DNS/URI subject alternative name,
//     e.g. "worker:1"); expired, other-CA or other-task certificates fail.
//     The CA and certificates come from cluster.tls's files, or, by default
//     in a cluster from the environment, from the job CA the chief's
//     rendezvous ran (net/job_ca.hpp: `identity`, in memory).
//   - insecure: plain TCP (cluster.insecure); the guard still runs.
// Either way the link checks the peer is the task the gate named, and BASP
// sees nothing before the TLS handshake completed.
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/tls_records.hpp"

namespace troupe {

struct cluster_spec;
struct task_identity;

struct link_security {
  enum class trust { psk, certificates, insecure };
  trust kind = trust::psk;
  std::string psk_key;  // derive_key(secret, key_purpose::tls_psk)
  std::string ca_file, cert_file, key_file;
  // certificates: the job CA's issue (net/job_ca.hpp) in place of the
  // files, when set.
  std::shared_ptr<const task_identity> identity;
  uint64_t max_frame_bytes = uint64_t{256} << 20;  // the guard's cap
  // The process's budget for bytes of frames not yet whole, across links
  // (net/frame_budget.hpp); 0: unfinished_budget(max_frame_bytes).
  uint64_t max_unfinished_bytes = 0;
  std::chrono::milliseconds handshake_timeout{10000};
  // When this end's records update their keys (tests lower it).
  uint64_t records_per_key = tls13::default_records_per_key;
};

// A link that cannot be set up here (unreadable certificate, no
// socketpair); what() names the file or the call.
class link_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The default budget for unfinished frames: one frame of the cap, and room
// beside it for the small ones of the other links.
inline uint64_t unfinished_budget(uint64_t max_frame_bytes) {
  return max_frame_bytes + (uint64_t{32} << 20);
}

// The security a cluster spec asks for (cluster.tls, cluster.insecure,
// cluster.identity with the identity this process was issued, if any:
// net/job_ca.hpp); `max_frame_bytes` from cluster.max_message_mb or the
// caller's derivation.
link_security link_security_for(const cluster_spec& spec, const std::string& secret,
                                uint64_t max_frame_bytes);
// With certificates and no cluster secret (cluster.tls alone), what keys the
// gate's exchange and the node handshake in place of a secret: a value
// derived from the cluster CA's certificate (its DER bytes, SHA-256), which
// every task holds and a stranger does not, so a stranger is refused at the
// gate before any TLS state is made for it. Not a secret in the strong
// sense: whoever holds the CA certificate passes the gate, and the TLS
// handshake (capped, max_tls_handshakes) then asks for a certificate of
// that CA. `sec`: certificates, from files or the job CA. Throws link_error
// naming the CA file when it holds no certificate.
std::string certificates_only_secret(const link_security& sec);

// Loads the certificates now, so a bad file is an error at start-up naming
// it (cluster.tls.cert "x.pem": ...), not a failed connection later.
void check_link_security(const link_security& sec);

struct link_params {
  bool listener = false;  // this end accepted the connection (the TLS server)
  std::string me;         // this process's task
  std::string peer_task;  // the task the gate's exchange named
  std::string peer_address;
  std::string server_challenge, client_challenge;  // the gate's
  // This node's id as BASP writes it (serialized_node_id); empty: not BASP
  // (the rendezvous), no guard.
  std::vector<char> local_node;
};

struct link_end {
  int plain_fd = -1;  // the caller's end: hand it to BASP (new_scribe)
  // "" once TLS is up and the peer is the expected task; else why not.
  std::shared_future<std::string> ready;
};

// Takes `tcp_fd` (non-blocking, after the gate's exchange) over, also when
// it throws link_error (then it has closed it).
link_end open_link(int tcp_fd, const link_security& sec, link_params p);

// The links of this process, for tests and metrics; counters only grow.
struct link_stats {
  uint64_t opened = 0;
  uint64_t failed_handshakes = 0;
  uint64_t closed_by_guard = 0;  // an oversized or malformed frame
  uint64_t frames_dropped = 0;   // spoofed node ids, repeated handshakes
  uint64_t bytes_in = 0;         // decrypted, from peers
  uint64_t bytes_out = 0;        // to peers, before encryption
  uint64_t key_updates = 0;      // TLS KeyUpdates sent and followed, counted as links end
  // Accepted links closed in their TLS handshake to make room for newer ones
  // (more than max_tls_handshakes() at once).
  uint64_t handshakes_evicted = 0;
};
link_stats link_totals();

// How many accepted links may be in their TLS handshake at once in this
// process: 64, or a sixteenth of the descriptor limit if less (at least 4).
// Past the gate a link costs three descriptors and a TLS state before its
// peer proved anything; in a cluster with certificates and no secret the
// gate proves nothing, so this is what keeps a flood from taking them all.
// One more evicts the oldest (a real peer finishes in milliseconds).
std::size_t max_tls_handshakes();

}  // namespace troupe
