#include "net/basp_guard.hpp"

#include <fmt/format.h>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

namespace troupe {

namespace {

// BASP 0.17's message types (caf/io/basp/message_type.hpp).
enum : uint8_t {
  server_handshake = 0,
  client_handshake = 1,
  direct_message = 2,
  routed_message = 3,
  monitor_message = 4,
  down_message = 5,
  heartbeat = 6,
};

// Where a header keeps what the guard reads (caf/io/basp/header.hpp:
// operation, two padding bytes, flags, payload_len, operation_data,
// source_actor, dest_actor; integers big-endian).
constexpr std::size_t kPayloadLenAt = 4;
constexpr std::size_t kOperationDataAt = 8;
constexpr std::size_t kSourceActorAt = 16;
// operation_data of a message is its message id; this bit marks a response
// (caf/message_id.hpp: response_flag_mask).
constexpr uint64_t kResponseFlag = uint64_t{1} << 63;

// A message's content leads with an empty forwarding stack (one varbyte 0),
// the object number 0 (two bytes) and its type name as a string (a varbyte
// length, then the bytes: "@<>+" and each element's portable name; caf/
// message.cpp, save). The names the guard refuses are all shorter than this.
constexpr std::size_t kLongestRefusedName = 32;
constexpr std::size_t kContentLeadBytes = 1 + 2 + 1 + kLongestRefusedName;

// Contents no peer sends troupe across processes, and what they would do:
// a system message an actor acts on whatever its behavior, or CAF's link
// request (a proxy's link_atom), which would make the receiver die with any
// actor the peer names as its own. Exits come only from the chief: its
// driver stops the rl_actors it placed on other tasks.
struct refused_content {
  std::string_view name;
  std::string_view what;
};
constexpr refused_content kRefusedContents[] = {
    {"@<>+@exit", "an exit_msg"},
    {"@<>+@down", "a down_msg"},
    {"@<>+@group_down", "a group_down_msg"},
    {"@<>+@timeout", "a timeout_msg"},
    {"@<>+@atom+@strong_actor_ptr", "a link or unlink request"},
};

uint64_t big_endian(const char* at, std::size_t bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(at);
  uint64_t x = 0;
  for (std::size_t i = 0; i < bytes; ++i) x = (x << 8) | b[i];
  return x;
}

const char* type_name(uint8_t op) {
  static const char* names[] = {"server_handshake", "client_handshake", "direct_message",
                                "routed_message",   "monitor_message",  "down_message",
                                "heartbeat"};
  return op <= heartbeat ? names[op] : "unknown";
}

std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string key_of(const std::vector<char>& local, std::string_view what) {
  return std::string(local.begin(), local.end()) + '|' + std::string(what);
}

// Who may be which node, per local node. A node id is a claim a peer writes
// into its handshake; a task is what TLS proved. The first connection that
// authenticates a node id binds it to its task for good. While a connection
// is live, no second one may claim its node id (CAF would take the node's
// routes over to the newer connection: the select-connection flag) or its
// task (a holder of the secret speaking for a task that is there).
class link_claims {
 public:
  // Empty when the connection `link` may be `node` as `task`; else why not.
  std::string claim(const std::vector<char>& local, const std::vector<char>& node,
                    const std::string& task, const void* link) {
    std::lock_guard<std::mutex> guard(mutex_);
    const auto node_key = key_of(local, std::string_view(node.data(), node.size()));
    const auto task_key = key_of(local, task);
    auto [owner, inserted] = owners_.emplace(node_key, task);
    if (!inserted && owner->second != task) return "claims the node id of " + owner->second;
    if (auto live = live_nodes_.find(node_key); live != live_nodes_.end() && live->second != link)
      return "claims the node id of " + task +
             ", whose connection is live: a second connection may not take over its routes";
    if (auto live = live_tasks_.find(task_key); live != live_tasks_.end() && live->second != link)
      return task + " has a live connection already: a second connection may not claim a live task";
    live_nodes_[node_key] = link;
    live_tasks_[task_key] = link;
    return {};
  }

  // The connection `link` ended: its node id and task are free again.
  void release(const void* link) {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto* live : {&live_nodes_, &live_tasks_})
      for (auto i = live->begin(); i != live->end();)
        i = i->second == link ? live->erase(i) : std::next(i);
  }

  bool task_is_live(const std::vector<char>& local, const std::string& task) {
    std::lock_guard<std::mutex> guard(mutex_);
    return live_tasks_.count(key_of(local, task)) > 0;
  }

  // The task of `node`'s live connection to `local`, or empty.
  std::string live_task(const std::vector<char>& local, const std::vector<char>& node) {
    std::lock_guard<std::mutex> guard(mutex_);
    const auto node_key = key_of(local, std::string_view(node.data(), node.size()));
    return live_nodes_.count(node_key) ? owners_[node_key] : std::string();
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> owners_;      // node -> its task, for good
  std::map<std::string, const void*> live_nodes_;  // node -> its live connection
  std::map<std::string, const void*> live_tasks_;  // task -> its live connection
};

// Never destroyed: guards release their claims in their destructors, and a
// link's guard may be destroyed by another static's destructor at exit.
link_claims& claims() {
  static auto* c = new link_claims;
  return *c;
}

}  // namespace

std::vector<char> serialized_node_id(const caf::node_id& node) {
  std::vector<char> out;
  caf::binary_serializer sink{nullptr, out};
  if (auto err = sink(const_cast<caf::node_id&>(node))) out.clear();
  return out;
}

basp_guard::basp_guard(side me, std::vector<char> local_node, std::string peer_task,
                       uint64_t max_frame_bytes)
    : me_(me),
      local_node_(std::move(local_node)),
      peer_task_(std::move(peer_task)),
      cap_(max_frame_bytes) {}

basp_guard::~basp_guard() {
  if (!peer_node_.empty()) claims().release(this);
}

std::string live_task_of(const caf::node_id& local, const caf::node_id& peer) {
  return claims().live_task(serialized_node_id(local), serialized_node_id(peer));
}

bool task_has_live_link(const caf::node_id& local, const std::string& task) {
  return claims().task_is_live(serialized_node_id(local), task);
}

basp_guard::drops basp_guard::take_drops() {
  return std::exchange(drops_, drops{});
}

void basp_guard::drop(std::string why) {
  ++dropped_total_;
  if (drops_.count++ == 0) drops_.first_reason = std::move(why);
}

std::string basp_guard::feed(const char* data, std::size_t n, std::vector<char>& out) {
  while (n > 0) {
    switch (phase_) {
      case phase::header: {
        auto k = std::min(n, kHeaderBytes - header_got_);
        std::copy(data, data + k, header_ + header_got_);
        header_got_ += k;
        data += k;
        n -= k;
        if (header_got_ == kHeaderBytes) {
          if (auto problem = on_header(); !problem.empty()) return problem;
          if (need_ == 0)
            if (auto problem = decide(out); !problem.empty()) return problem;
        }
        break;
      }
      case phase::inspect: {
        auto k = std::min(n, need_ - inspect_.size());
        inspect_.insert(inspect_.end(), data, data + k);
        data += k;
        n -= k;
        if (inspect_.size() == need_)
          if (auto problem = decide(out); !problem.empty()) return problem;
        break;
      }
      case phase::pass:
      case phase::skip: {
        auto k = static_cast<std::size_t>(std::min<uint64_t>(n, left_));
        if (phase_ == phase::pass) hold(data, k);
        data += k;
        n -= k;
        left_ -= k;
        if (left_ == 0) {
          if (phase_ == phase::pass) release(out);
          phase_ = phase::header;
        }
        break;
      }
    }
  }
  return {};
}

std::string basp_guard::on_header() {
  header_got_ = 0;
  operation_ = static_cast<uint8_t>(header_[0]);
  payload_len_ = static_cast<uint32_t>(big_endian(header_ + kPayloadLenAt, 4));
  if (operation_ > heartbeat)
    return fmt::format("sent a frame of unknown type {} (not BASP)", operation_);
  if (payload_len_ > cap_)
    return fmt::format("announced a {} of {}, over this job's cap of {} (cluster.max_message_mb)",
                       type_name(operation_), mib(payload_len_), mib(cap_));
  const uint8_t first = me_ == side::listener ? client_handshake : server_handshake;
  if (peer_node_.empty() && operation_ != first)
    return fmt::format("sent a {} before its {}", type_name(operation_), type_name(first));
  inspect_.clear();
  switch (operation_) {
    case server_handshake:
    case client_handshake:
      if (payload_len_ > kMaxHandshakeBytes)
        return fmt::format("sent a {} of {}", type_name(operation_), mib(payload_len_));
      need_ = payload_len_;
      break;
    case direct_message:
      need_ = is_response() ? 0 : std::min<std::size_t>(payload_len_, kContentLeadBytes);
      break;
    case routed_message:
    case monitor_message:
    case down_message: {
      // Source and destination node ids lead the payload (then a routed
      // message's content).
      const auto lead = peer_node_.size() + local_node_.size() +
                        (operation_ == routed_message && !is_response() ? kContentLeadBytes : 0);
      need_ = std::min<std::size_t>(payload_len_, lead);
      break;
    }
    default:
      need_ = 0;
  }
  phase_ = phase::inspect;
  return {};
}

// A message without a sender (source actor 0) is what anon_send and
// anon_send_exit put on the wire; from another process it is a stranger's
// (troupe sends across processes from an actor: runtime/local_send.hpp), and
// an exit_msg among them would stop its receiver. Responses pass: CAF
// answers a request whose receiver is gone without a sender (its request
// bouncer), and a response reaches an actor only as the answer to a request
// it awaits, never its behavior or an exit (scheduled_actor::consume), which
// a sender of any id could forge as well.
bool basp_guard::anonymous_message() const {
  if (operation_ != direct_message && operation_ != routed_message) return false;
  return big_endian(header_ + kSourceActorAt, 8) == 0 && !is_response();
}

bool basp_guard::is_response() const {
  return (big_endian(header_ + kOperationDataAt, 8) & kResponseFlag) != 0;
}

// What a message's content is when troupe refuses it from this peer
// (kRefusedContents), else empty. A response is never refused (it reaches
// only a request's handler); nor is a content too short to name a type
// (CAF fails to read it and drops it).
std::string basp_guard::refused_content_of() const {
  if ((operation_ != direct_message && operation_ != routed_message) || is_response()) return {};
  const std::size_t at = operation_ == routed_message ? peer_node_.size() + local_node_.size() : 0;
  if (inspect_.size() < at + 4) return {};
  const auto* lead = reinterpret_cast<const unsigned char*>(inspect_.data() + at);
  if (lead[0] != 0)  // troupe forwards nothing across processes
    return "a message with a forwarding stack from " + peer_task_;
  const std::size_t length = lead[3];  // one varbyte: a long name has the high bit set
  if (length > kLongestRefusedName || inspect_.size() < at + 4 + length) return {};
  const std::string_view name(inspect_.data() + at + 4, length);
  for (const auto& r : kRefusedContents)
    if (name == r.name && !(r.name == "@<>+@exit" && peer_task_ == "chief:0"))
      return std::string(r.what) + " from " + peer_task_;
  return {};
}

// The node ids a frame's payload names: a handshake's becomes the
// connection's identity; a routed, monitor or down message's must be the
// connection's and this node's. Sets `pass`; returns why to close, if so.
std::string basp_guard::check_payload(bool& pass) {
  switch (operation_) {
    case server_handshake:
    case client_handshake: {
      caf::binary_deserializer source{static_cast<caf::execution_unit*>(nullptr), inspect_.data(),
                                      inspect_.size()};
      caf::node_id node;
      if (source(node) || !node)
        return fmt::format("sent a {} without a valid node id", type_name(operation_));
      auto bytes = serialized_node_id(node);
      if (peer_node_.empty()) {
        if (bytes == local_node_) return "claims this node's own id";
        if (auto refused = claims().claim(local_node_, bytes, peer_task_, this); !refused.empty())
          return refused;
        peer_node_ = std::move(bytes);
      } else if (operation_ != client_handshake || me_ != side::listener || bytes != peer_node_) {
        pass = false;
        drop(fmt::format("a repeated {} naming {} node", type_name(operation_),
                         bytes == peer_node_ ? "its own" : "another"));
      }
      break;
    }
    case routed_message:
    case monitor_message:
    case down_message: {
      const auto k = peer_node_.size();
      const bool from_peer = inspect_.size() >= k + local_node_.size() &&
                             std::equal(peer_node_.begin(), peer_node_.end(), inspect_.begin());
      const bool to_me = from_peer && std::equal(local_node_.begin(), local_node_.end(),
                                                 inspect_.begin() + static_cast<std::ptrdiff_t>(k));
      if (!from_peer) {
        pass = false;
        drop(fmt::format("a {} claiming another source node", type_name(operation_)));
      } else if (!to_me) {
        pass = false;
        drop(fmt::format("a {} for another node (no forwarding through this one)",
                         type_name(operation_)));
      }
      break;
    }
    default:
      break;
  }
  return {};
}

std::string basp_guard::decide(std::vector<char>& out) {
  bool pass = true;
  if (anonymous_message()) {
    pass = false;
    drop(fmt::format("a {} without a sender (source actor 0)", type_name(operation_)));
  } else if (auto problem = check_payload(pass); !problem.empty()) {
    return problem;
  } else if (auto refused = refused_content_of(); pass && !refused.empty()) {
    pass = false;
    drop(fmt::format("a {} carrying {}", type_name(operation_), refused));
  }
  left_ = payload_len_ - inspect_.size();
  if (pass) {
    held_.clear();
    hold(header_, kHeaderBytes);
    hold(inspect_.data(), inspect_.size());
    if (left_ == 0) release(out);
  }
  inspect_.clear();
  phase_ = left_ == 0 ? phase::header : (pass ? phase::pass : phase::skip);
  return {};
}

void basp_guard::hold(const char* data, std::size_t n) {
  // Grows with what arrived (at most doubling), never past the frame.
  if (held_.size() + n > held_.capacity()) {
    const uint64_t frame = kHeaderBytes + uint64_t{payload_len_};
    held_.reserve(static_cast<std::size_t>(
        std::min<uint64_t>(frame, std::max<uint64_t>(held_.size() + n, 2 * held_.capacity()))));
  }
  held_.insert(held_.end(), data, data + n);
}

void basp_guard::release(std::vector<char>& out) {
  if (out.empty())
    out.swap(held_);  // a large frame moves, not copied
  else
    out.insert(out.end(), held_.begin(), held_.end());
  // A large frame's memory goes with it; a small buffer is kept for the next.
  if (held_.capacity() > kKeptBytes)
    std::vector<char>().swap(held_);
  else
    held_.clear();
}

}  // namespace troupe
