#pragma once
// The rendezvous at the chief: how the ranks of a cluster from the
// environment (config/cluster_env.hpp) learn each other's addresses when
// only the chief's is known in advance.
//
//   chief (rank 0)   listens at its address behind a gate (runtime/gate.hpp:
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
// Frames (only after the gate's exchange, so only between holders of the
// secret; each of a size known before reading, the reply bounded):
//   rank -> chief   announce: magic "troupeR1", rank and world size (8 bytes
//                   each, big-endian), host:port NUL-padded to 262 bytes
//   chief -> rank   reply: magic, payload length (4 bytes, big-endian, at most
//                   kMaxReplyBytes), payload: {"tasks": {...}} or {"error": "why"}
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/cluster_env.hpp"
#include "config/job_config.hpp"

namespace troupe {

using cluster_tasks = std::map<std::string, std::vector<std::string>>;

// Resolves this process's rank from `env`, meets the other ranks at the
// chief, writes the cluster they form into c.cluster->tasks (checked as a
// hand-written one would be) and returns this process's task. Throws
// cluster_env_error (a bad variable), config_error, secret_error, or
// job_error (the rendezvous failed or timed out).
task_id join_cluster_from_environment(job_config& c, const environment_map& env);

// The chief's side: `me` is rank 0. Returns the tasks map.
cluster_tasks serve_rendezvous(const std::string& secret, const cluster_env& me, int64_t ps_ranks,
                               std::chrono::duration<double> timeout);

// Another rank's side: announces `address` (where it listens) to the chief
// at me.chief. Returns the tasks map.
cluster_tasks join_rendezvous(const std::string& secret, const cluster_env& me,
                              const std::string& address, std::chrono::duration<double> timeout);

// The frames, without sockets (for the tests and the fuzz target).
namespace rendezvous_wire {
inline constexpr std::size_t kMagicBytes = 8;
inline constexpr std::size_t kAddressBytes = 262;  // "[" 253 "]:" 5 digits, with room
inline constexpr std::size_t kAnnounceBytes = kMagicBytes + 8 + 8 + kAddressBytes;
inline constexpr std::size_t kReplyHeaderBytes = kMagicBytes + 4;
inline constexpr std::size_t kMaxReplyBytes = 1 << 22;
inline constexpr char kMagic[kMagicBytes + 1] = "troupeR1";

std::string make_announce(int64_t rank, int64_t world_size, const std::string& address);
struct announce_check {
  int64_t rank = -1;
  std::string address;
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
}  // namespace rendezvous_wire

}  // namespace troupe
