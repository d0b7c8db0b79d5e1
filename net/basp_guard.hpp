#pragma once
// The guard on every BASP frame a peer sends, before CAF parses it.
//
// CAF 0.17's BASP broker trusts the wire once a connection is up: it sizes
// a buffer from a header's payload_len (32 bytes can make it zero-fill
// 4 GiB), it takes the node ids in a payload as given (a routed_message
// names its own source node; a client_handshake with the select-connection
// flag reroutes that node's traffic to the connection it came on). TLS
// says which task is at the other end of a connection (runtime/
// secure_link.hpp); this guard makes BASP believe nothing else:
//
//   - every frame: a known message type, and payload_len at most the job's
//     cap, or the connection closes (the only answer to a peer that lies
//     about sizes: nothing later in the stream can be trusted);
//   - the first frame is the handshake the peer's role sends (a listener
//     sends server_handshake, a connector client_handshake); the node id in
//     it becomes the connection's identity. A node id already bound to
//     another task (by an earlier connection) closes the connection, and so
//     does a node id or a task that another connection to this node holds
//     while it is live: a holder of the secret who passes the gate as a
//     task that is there (with a pre-shared key, the task is a name it
//     claims) can neither take over that node's routes (CAF moves them to
//     a connection whose handshake carries the select-connection flag) nor
//     speak as that task beside it. The claim ends with the connection
//     (the guard's destructor);
//   - later handshakes pass only from the connector, for its own node id
//     (CAF repeats it with the select-connection flag); any other is
//     dropped;
//   - routed, monitor and down messages pass only when their payload names
//     the connection's node as source and this node as destination (no
//     spoofed senders, no forwarding through this node); others are dropped;
//   - direct messages and heartbeats carry no node id: CAF attributes them
//     to the connection's node already;
//   - direct and routed messages without a sender (source actor 0 in the
//     header: what anon_send and anon_send_exit write) are dropped, unless
//     they are responses: an anonymous exit_msg would stop any actor whose
//     id a holder of the secret names (a shard, a reducer, a learner), and
//     troupe itself sends across processes only from an actor. A response
//     passes (CAF bounces a request to a gone actor without a sender), as
//     it reaches an actor only as the answer to a request it awaits;
//   - a message whose content is a system message (exit_msg, down_msg,
//     group_down_msg, timeout_msg) or CAF's link request is dropped, and so
//     is one with a forwarding stack: with any sender id it likes, a holder
//     of the secret could otherwise stop an actor (an exit, or a link to an
//     actor of its own that it then reports down) or fake a death the
//     coordinator acts on. troupe sends none of these across processes,
//     links nothing across them and forwards nothing; the one exception is
//     an exit_msg from the chief (its driver stops the rl_actors it placed
//     on other tasks). The guard reads the content's type name, the first
//     bytes after the stack (net/basp_guard.cpp, kRefusedContents).
//
// Whole frames: a frame that passes goes to BASP only once its last byte
// arrived (CAF sizes and zero-fills its buffer from the header, so a header
// alone would make it allocate the cap). Until then the guard holds it, in
// memory that grows with the bytes received, never the announced size up
// front; held_bytes() is what the process's budget for unfinished frames
// counts (net/frame_budget.hpp).
#include <caf/node_id.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

class basp_guard {
 public:
  enum class side { listener, connector };  // this end's role
  static constexpr std::size_t kHeaderBytes = 32;
  static constexpr uint32_t kMaxHandshakeBytes = 1 << 20;
  // The largest buffer a link keeps between frames (the guard's, and the
  // one a released frame goes out in): frames up to this size reuse memory
  // already touched (fresh pages for every frame cost more than the copy),
  // larger ones are allocated as their bytes arrive and freed once handed on.
  static constexpr std::size_t kKeptBytes = 4 << 20;

  // `local_node`: this node's id as BASP serializes it; `peer_task`: the
  // task the connection authenticated as; `max_frame_bytes`: the cap.
  basp_guard(side me, std::vector<char> local_node, std::string peer_task,
             uint64_t max_frame_bytes);
  ~basp_guard();  // frees the node id and task this connection held
  basp_guard(const basp_guard&) = delete;
  basp_guard& operator=(const basp_guard&) = delete;

  // Reads `n` bytes from the peer, appending what BASP may see to `out`.
  // Returns empty, or why the connection must close (for the log).
  std::string feed(const char* data, std::size_t n, std::vector<char>& out);

  // Dropped frames since the last call, with the reason of the first.
  struct drops {
    uint64_t count = 0;
    std::string first_reason;
  };
  drops take_drops();
  uint64_t dropped_total() const { return dropped_total_; }
  // Bytes of the frame in progress held here (header included).
  uint64_t held_bytes() const { return header_got_ + inspect_.size() + held_.size(); }
  // The peer's node id once its handshake arrived (serialized), else empty.
  const std::vector<char>& peer_node() const { return peer_node_; }

 private:
  enum class phase { header, inspect, pass, skip };
  std::string on_header();
  std::string decide(std::vector<char>& out);
  bool anonymous_message() const;
  bool is_response() const;
  std::string refused_content_of() const;
  std::string check_payload(bool& pass);
  void hold(const char* data, std::size_t n);
  void release(std::vector<char>& out);
  void drop(std::string why);

  side me_;
  std::vector<char> local_node_;
  std::string peer_task_;
  uint64_t cap_;
  phase phase_ = phase::header;
  char header_[kHeaderBytes] = {};
  std::size_t header_got_ = 0;
  uint8_t operation_ = 0;
  uint32_t payload_len_ = 0;
  std::vector<char> inspect_;  // the payload's first bytes, held until decided
  std::size_t need_ = 0;       // how many of them decide
  uint64_t left_ = 0;          // payload bytes still to pass or skip
  std::vector<char> held_;     // the frame that passes, until its last byte
  std::vector<char> peer_node_;
  uint64_t dropped_total_ = 0;
  drops drops_;
};

// A node id's bytes as BASP writes them (the guard compares these).
std::vector<char> serialized_node_id(const caf::node_id& node);

// The task whose live connection to `local` carries node `peer` (its
// handshake passed a guard), or empty: what TLS proved about a sender, for
// the node actor's handshake (runtime/node_actor.cpp).
std::string live_task_of(const caf::node_id& local, const caf::node_id& peer);
// Whether `task` has a live connection to `local` (the gate's check).
bool task_has_live_link(const caf::node_id& local, const std::string& task);

}  // namespace troupe
