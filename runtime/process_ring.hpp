#pragma once
// process_ring: collectives between processes on sockets of their own, run
// on the calling thread (gloo's way): no actor, no BASP frame, no thread
// hand-over between a replica's gradients and the wire. Mirrored across
// processes uses it for the process's sum (strategies/mirrored_step.cpp, through
// collectives/hierarchical_group.hpp); the ring nodes (actors/reducers/remote_ring.hpp) stay the
// control plane that introduces the links.
//
// Links: rank r sends on a TCP connection it opened to rank r+1 (mod P) and
// receives on the one rank r-1 opened to it. Each step sends and receives
// at once in one poll loop (non-blocking sockets), so two ranks sending to
// each other never wait on each other's full socket buffers. A received
// range is combined into the caller's buffer piece by piece while the rest
// is still on the wire.
//
// Algorithm (rank r of P, the buffer split into P segments as the ring
// nodes split it, reducers::split_range): reduce-scatter, steps s = 0..P-2,
// r sends segment (r - s) and combines segment (r - s - 1) from r-1; then
// all-gather, r sends the segment it finished and copies the one r-1 did.
// Each segment is summed in the same order as the ring nodes sum it and
// finished by one rank only, so every rank ends bit-identical.
//
// Wire: TLS 1.3 application-data records (net/tls_records.hpp,
// AES-128-GCM), or plain bytes (cluster.insecure). Records are cut the same
// way on both ends (a buffer's pieces sealed separately), so the receiver
// knows how many wire bytes a collective is and never reads into the next.
//
// Threat model. The listener of each link makes a fresh random 32-byte link
// key and gives it only to the rank that is to connect, over the job's
// authenticated and encrypted links (a typed message between the ring
// nodes, accepted only from the ring peer it names). Whoever connects first
// gets a fresh 32-byte challenge and must answer HMAC-SHA256(link key,
// challenge) within a few seconds; it is compared in constant time before
// anything else is read, a wrong or late answer closes that connection only
// (up to 16 unproven connections wait side by side; a stranger cannot delay
// the peer past its own timeout), and the first proven one closes the
// listener. The link's traffic secret is HKDF(salt = challenge, ikm = link
// key): fresh for every connection, never the key itself. A stranger thus
// sees a challenge and nothing else; a task of the job that was not handed
// the key can neither join nor read a link; an on-path attacker can cut a
// link (the collective then fails, naming it) but not read or change it.
//
// Same host: with same_host_link::unix_socket or ::shared_memory the
// listener also listens on an abstract Unix socket (Linux: a name, no file)
// derived from the link key, and a connecting rank in the same network
// namespace reaches it there instead of over TCP; elsewhere the name does not exist and it connects
// over TCP as before. Such a link carries plain bytes: it never leaves the
// kernel, which shows it to no one but root; both ends also require the
// other to run under their own uid (SO_PEERCRED), and the key's proof is
// asked as on TCP. The name is no secret (/proc/net/unix lists it) and
// cannot be taken first: it is bound before the key is handed out, and held
// until the proven connection is accepted. This is how MPI and NCCL treat
// ranks on one host (shared memory, no encryption), and it is the common
// case of one process per GPU. With ::shared_memory (same_host "shm") the
// admitted Unix socket then hands over a shared ring of bytes
// (runtime/ring_shm.hpp, its protocol and threat model there) that carries
// the data instead, the socket left with doorbells and the peer's death;
// the steps, their order and so the sums are the same on every link kind.
//
// Failure: a peer that closes, sends a record that does not authenticate,
// or is silent past the timeout fails the collective with device_error
// naming the link and its task; the sockets are shut then, so the peers
// fail theirs at once too. abort() (from any thread) does the same. A
// failed ring stays failed.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/idle_wait.hpp"
#include "collectives/process_group.hpp"
#include "config/reducer_links.hpp"

namespace troupe {

class ring_shm;

namespace net {
class reactor;
}  // namespace net

namespace tls13 {
class record_writer;
class record_reader;
}  // namespace tls13

// One end of a ring link, connected and proven.
struct ring_socket {
  int fd = -1;                    // owned from here on
  std::string traffic_secret;     // 32 bytes; empty: plain bytes (cluster.insecure, same host)
  std::string peer;               // its task, for errors ("worker:0")
  bool same_host = false;         // a Unix socket to a process of this host and uid
  std::shared_ptr<ring_shm> shm;  // same host: the data go through this ring instead
};

// What a float is on the wire: itself, or bfloat16 (half the bytes; the sums
// are still formed in float32 on each rank, and a finished value is rounded
// to bfloat16 on the rank that finished it too, so all ranks stay equal).
enum class ring_wire { fp32, bf16 };

class process_ring final : public process_group {
 public:
  // Takes both sockets over (also when it throws).
  process_ring(int rank, int size, ring_socket to_next, ring_socket from_prev,
               std::chrono::milliseconds timeout = std::chrono::seconds(60),
               ring_wire wire = ring_wire::fp32);
  ~process_ring() override;
  process_ring(const process_ring&) = delete;
  process_ring& operator=(const process_ring&) = delete;

  // How long a side with nothing to move gives its core away between looks
  // before it sleeps (collectives/idle_wait.hpp; strategy.reducer.yield_us).
  void set_yield_for(std::chrono::microseconds yield_for) { yield_for_ = yield_for; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(float* data, std::size_t n, reduce_op op) override;
  void reduce_scatter(float* data, std::size_t chunk, reduce_op op) override;
  void all_gather(float* data, std::size_t chunk) override;
  void check() override;
  void abort(const std::string& why) override;

  // One collective over all the spans (sealed span by span, so both ends
  // cut the same records).
  void all_reduce_spans(const std::vector<float_span>& spans, reduce_op op) override;

  // What each link is: "shared memory, same host", "Unix socket, same
  // host", "TLS 1.3 records" or "plain, cluster.insecure".
  const std::string& next_link() const { return next_link_; }
  const std::string& prev_link() const { return prev_link_; }

  // Bytes this rank sent and received on its links (wire bytes).
  uint64_t bytes_sent() const { return sent_bytes_; }
  uint64_t bytes_received() const { return received_bytes_; }

  class outbound;
  class inbound;
  struct step;

 private:
  // The steps of a ring collective over `seg` (P + 1 boundaries into the
  // flat buffer): reduce-scatter so that rank r finishes segment r +
  // finish, then (gather) that segment to every rank.
  std::vector<step> ring_steps(const std::vector<float_span>& spans,
                               const std::vector<int64_t>& seg, int finish, bool reduce,
                               bool gather, reduce_op op) const;
  // Runs the steps, sending and receiving at once in one poll loop.
  void run(const std::vector<step>& steps, reduce_op op);
  bool sleep(std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void fail(const std::string& why);
  int mod(int64_t x) const { return static_cast<int>(((x % size_) + size_) % size_); }

  int rank_;
  int size_;
  std::string next_link_, prev_link_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds yield_for_ = idle_wait::default_yield_for;
  std::unique_ptr<outbound> out_;
  std::unique_ptr<inbound> in_;
  std::unique_ptr<net::reactor> poller_;  // the links and the pipe abort() wakes it through
  std::mutex failure_mutex_;
  std::string failure_;
  std::atomic<bool> failed_{false};
  bool shm_peer_closed_ = false;  // a shared ring's socket reached its end
  uint64_t sent_bytes_ = 0;
  uint64_t received_bytes_ = 0;
};

// --- setting the links up ---

// What the listener of a link hands to the rank that is to connect.
struct ring_link_offer {
  std::string host;
  uint16_t port = 0;
  std::string key;  // 32 random bytes
};

// A listening socket for one link, on `bind_host` at a port the OS picks,
// with a fresh key. Throws device_error naming the call that failed.
// Unless `same_host` is tcp, also on the key's abstract Unix socket (and
// with shared_memory, a connection there gets a shared ring once admitted).
class ring_link_listener {
 public:
  explicit ring_link_listener(const std::string& bind_host,
                              same_host_link same_host = same_host_link::tcp);
  ~ring_link_listener();
  ring_link_listener(const ring_link_listener&) = delete;
  ring_link_listener& operator=(const ring_link_listener&) = delete;

  const ring_link_offer& offer() const { return offer_; }
  // The first connection that answers its challenge with the key's proof;
  // closes the listener. `peer` names the expected task in errors. Throws
  // device_error at the deadline.
  ring_socket accept(std::chrono::steady_clock::time_point deadline, const std::string& peer,
                     bool encrypted);

 private:
  void listen_on_unix_name();
  void close_listeners();

  int fd_ = -1;
  int unix_fd_ = -1;
  std::shared_ptr<ring_shm> shm_;  // shared_memory: the ring for the proven Unix connection
  ring_link_offer offer_;
};

// Connects to an offer and proves the key (retrying a refused connection
// until the deadline); unless `same_host` is tcp, over the offer's Unix
// socket where this host has it (taking the shared ring the listener hands
// over with shared_memory; both ends must be made with the same kind).
// Throws device_error naming `peer` and the cause.
ring_socket connect_ring_link(const ring_link_offer& offer,
                              std::chrono::steady_clock::time_point deadline,
                              const std::string& peer, bool encrypted,
                              same_host_link same_host = same_host_link::tcp);

// The proof and the traffic secret of a link (exposed for tests).
std::string ring_link_proof(const std::string& key, const std::string& challenge);
std::string ring_link_secret(const std::string& key, const std::string& challenge);
// The abstract Unix socket name of a link with `key` (its leading NUL included).
std::string ring_link_unix_name(const std::string& key);

}  // namespace troupe
