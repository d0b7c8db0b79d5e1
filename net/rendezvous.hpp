#pragma once
// The rendezvous at the chief: how the ranks of a cluster from the
// environment (config/cluster_env.hpp) learn each other's addresses when
// only the chief's is known in advance.
//
//   chief (rank 0)   listens at its address behind a gate (net/gate.hpp:
//                    the same exchange, limits and logging as every port of
//                    a node) and waits for every other rank;
//   rank r > 0       listens at its own port (TROUPE_PORT, else one the OS
//                    picks) and holds it for its node's gate (gate.hpp,
//                    held_listeners), connects to the chief through the
//                    gate, retrying with backoff while nobody listens there
//                    yet or the name does not resolve, and announces (r,
//                    world size, its host:port);
//   chief            reads every admitted connection's announce at once,
//                    each within 5 s of its admission (a slow or silent one
//                    delays no other); once every rank has announced, stops
//                    admitting, keeps its listening socket for its node's
//                    gate and answers each with the whole cluster.tasks map;
//                    then every process runs troupe node as if the cluster
//                    spec had been written by hand, each gate on the socket
//                    its process held, so no address handed out was ever
//                    free for someone else to take.
// A rank that cannot join within cluster.join_timeout_seconds ends with an
// error naming the chief's address; the chief ends naming the ranks that did
// not come. An announce with a rank outside the world, a rank other than the
// one its sender proved at the gate ("rank:N"), a rank already claimed by a
// connection still open, another world size or an address already taken is
// refused with a log line naming the peer, and the peer is told why. A rank
// whose connection closes before the cluster forms is free again (a
// restarted process may claim it).
//
// The announce is also the rank's certificate request to the job CA the
// chief makes at start (net/job_ca.hpp): the public half of a key pair
// the rank made, signed with its private half. The chief issues a
// certificate naming the rank's task (role_of_rank) when it accepts the
// announce, i.e. at most once while the rank's connection stays open; a
// claim of a rank held by a live connection is refused (naming the rank and
// its task) and logged; a restarted rank, the first connection gone, is
// issued a new one. The reply carries it with the CA's certificate.
//
// Frames (only after the gate's exchange, so only between holders of the
// secret; each of a size known before reading, the reply bounded):
//   rank -> chief   announce: magic "troupeR2", rank and world size (8 bytes
//                   each, big-endian), host:port NUL-padded to 262 bytes,
//                   Ed25519 public key (32 bytes), its signature over all
//                   of that (64 bytes; net/job_ca.hpp)
//   chief -> rank   reply: magic, payload length (4 bytes, big-endian, at most
//                   kMaxReplyBytes), payload: {"tasks": {...}, "certificate":
//                   PEM, "ca": PEM} or {"error": "why"}
#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/cluster_env.hpp"
#include "config/job_config.hpp"
#include "net/job_ca.hpp"

namespace troupe {

using cluster_tasks = std::map<std::string, std::vector<std::string>>;

// The rendezvous failed or timed out; what() names the rank and the chief's
// address. (net/ sits below the job's own error, actors/job_options.hpp's
// job_error; `troupe node` reports either the same way.)
class rendezvous_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Resolves this process's rank from `env`, meets the other ranks at the
// chief, writes the cluster they form into c.cluster->tasks (checked as a
// hand-written one would be) and returns this process's task. Throws
// cluster_env_error (a bad variable), config_error, secret_error, or
// rendezvous_error (the rendezvous failed or timed out).
task_id join_cluster_from_environment(job_config& c, const environment_map& env);

// The chief's side: `me` is rank 0. Returns the tasks map; `issued`, when
// given, gets the chief's own identity from the job CA.
cluster_tasks serve_rendezvous(const std::string& secret, const cluster_env& me, int64_t ps_ranks,
                               std::chrono::duration<double> timeout,
                               task_identity* issued = nullptr);

// Another rank's side: announces `address` (where it listens) to the chief
// at me.chief, with a certificate request for me.task. Returns the tasks
// map; `issued`, when given, gets the certificate the chief issued, checked
// (rendezvous_error if there is none, or it is not for this rank's key and task).
cluster_tasks join_rendezvous(const std::string& secret, const cluster_env& me,
                              const std::string& address, std::chrono::duration<double> timeout,
                              task_identity* issued = nullptr);

// A request to the chief and its reply frame, as the rendezvous, the chief's
// enrolment desk (net/chief_enrol.hpp) and the tests read it: sends
// `request` on `fd`, then reads the reply's header and, of the length the
// header gives, its payload, by `by`. `fd` stays open.
struct chief_reply {
  enum class status { ok, not_sent, no_answer, malformed };
  status state = status::ok;
  std::string payload;  // when ok
  std::string why;      // net::recv_exact's words (no_answer; malformed, if a read failed)
};
chief_reply request_reply(int fd, const std::string& request,
                          std::chrono::steady_clock::time_point by);

// The frames, without sockets (for the tests and the fuzz target).
namespace rendezvous_wire {
inline constexpr std::size_t kMagicBytes = 8;
inline constexpr std::size_t kAddressBytes = 262;  // "[" 253 "]:" 5 digits, with room
inline constexpr std::size_t kPublicKeyBytes = task_key::kPublicBytes;
inline constexpr std::size_t kSignatureBytes = task_key::kSignatureBytes;
// The part the signature covers.
inline constexpr std::size_t kRequestBytes = kMagicBytes + 8 + 8 + kAddressBytes + kPublicKeyBytes;
inline constexpr std::size_t kAnnounceBytes = kRequestBytes + kSignatureBytes;
inline constexpr std::size_t kReplyHeaderBytes = kMagicBytes + 4;
inline constexpr std::size_t kMaxReplyBytes = 1 << 22;
inline constexpr char kMagic[kMagicBytes + 1] = "troupeR2";

// The signed part of an announce (what task_key::sign_request signs).
std::string make_request(int64_t rank, int64_t world_size, const std::string& address,
                         const std::string& public_key);
// The whole announce; a key or signature left out is zeros (refused by the
// chief's job CA).
std::string make_announce(int64_t rank, int64_t world_size, const std::string& address,
                          const std::string& public_key = {}, const std::string& signature = {});
struct announce_check {
  int64_t rank = -1;
  std::string address;
  // Once well formed: the certificate request, for job_authority::issue.
  std::string request, public_key, signature;
  std::string problem;  // empty: well formed and fits the chief's world
};
// `world_size`: the chief's.
announce_check check_announce(std::string_view frame, int64_t world_size);

std::string make_reply(const nlohmann::json& payload);
// The payload length a reply header announces, or -1 when it is not a
// rendezvous reply or the length is over kMaxReplyBytes.
int64_t reply_length(std::string_view header);
// The payload's tasks map; throws std::invalid_argument with the chief's
// error, or naming what is malformed.
cluster_tasks tasks_of_reply(std::string_view payload);
// The payload's certificate and CA (PEM, unchecked); both empty when either
// is missing or the payload is malformed.
struct issued_certificate {
  std::string certificate, ca;
};
issued_certificate certificate_of_reply(std::string_view payload);
}  // namespace rendezvous_wire

}  // namespace troupe
