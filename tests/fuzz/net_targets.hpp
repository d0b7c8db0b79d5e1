#pragma once
// What a peer sends over the network, as fuzz targets (see targets.hpp for
// the convention: true when accepted, false when refused cleanly, anything
// else escapes):
//   - gate_frames: the gate's three frames (net/gate_wire.cpp), the only
//     bytes a process reads from a peer before it proved the cluster secret,
//     and the rendezvous' two after it (net/rendezvous_wire.cpp);
//   - message_bytes: every troupe message type, deserialized as CAF does for
//     an authenticated peer (the first byte picks the type);
//   - basp_frames: the BASP stream an authenticated peer sends, through the
//     frame guard (net/basp_guard.cpp) as a listener and as a connector;
//   - certificate_proof: the gate's certificate proof (certificates and no
//     secret) as a listener checks it (net/gate_certificate.cpp);
//   - enrol_frames: a certificate request as the chief's enrolment desk
//     (net/chief_enrol.hpp) and troupe launch read it, and the answer as an
//     enrolling task reads it (net/launch_enrol.cpp).
#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "config/secret.hpp"
#include "messages/messages.hpp"
#include "messages/node_messages.hpp"
#include "messages/remote_ring_messages.hpp"
#include "messages/rl_messages.hpp"
#include "net/basp_guard.hpp"
#include "net/gate.hpp"
#include "net/job_ca.hpp"
#include "net/launch_enrol.hpp"
#include "net/rendezvous.hpp"

namespace troupe::fuzz {

// The input as each frame, cut or zero-padded to the frame's size (so the
// fuzzer reaches the checks behind the size check), and as it is.
inline bool gate_frames(std::string_view bytes) {
  // The frames are MAC'd with the gate's derived key (the seed corpus's
  // frames are made with this one).
  static const std::string secret = derive_key("fuzz-secret-0123456789abcdef", key_purpose::gate);
  static const std::string challenge(gate_wire::kHexBytes, 'a');
  auto sized = [&](std::size_t n) {
    std::string s(bytes.substr(0, n));
    s.resize(n, '\0');
    return s;
  };
  bool any = false;
  any |= !gate_wire::check_hello(bytes).empty();
  any |= !gate_wire::check_hello(sized(gate_wire::kHelloBytes)).empty();
  any |= gate_wire::check_proof(secret, challenge, bytes).problem.empty();
  any |= gate_wire::check_proof(secret, challenge, sized(gate_wire::kProofBytes)).problem.empty();
  any |= gate_wire::check_verdict(secret, challenge, challenge, bytes).problem.empty();
  any |= gate_wire::check_verdict(secret, challenge, challenge, sized(gate_wire::kVerdictBytes))
             .problem.empty();
  any |= gate_wire::check_verdict(secret, challenge, challenge, sized(gate_wire::kVerdictBytes))
             .authentic;
  any |= gate_wire::certificate_proof_length(sized(gate_wire::kCertHeaderBytes)) >= 0;
  any |= gate_wire::split_certificate_proof(bytes).has_value();
  any |= rendezvous_wire::check_announce(sized(rendezvous_wire::kAnnounceBytes), 3).problem.empty();
  any |= rendezvous_wire::reply_length(sized(rendezvous_wire::kReplyHeaderBytes)) >= 0;
  try {
    any |= !rendezvous_wire::tasks_of_reply(bytes).empty();
  } catch (const std::invalid_argument&) {
  }
  // The job CA's certificate in the reply (net/job_ca.hpp): read, never
  // trusted here (the rank checks it against its key and the CA).
  any |= !rendezvous_wire::certificate_of_reply(bytes).certificate.empty();
  return any;
}

// The input as a certificate proof, as it is and with its header's lengths
// made to fit: checked against a job CA's certificate, never accepted (the
// fuzzer holds no key of that CA).
inline bool certificate_proof(std::string_view bytes) {
  static const job_authority ca;
  static const link_security listening = [] {
    link_security sec;
    sec.kind = link_security::trust::certificates;
    sec.identity = std::make_shared<const task_identity>(ca.issue_self("chief:0"));
    return sec;
  }();
  static const auto transcript = gate_wire::certificate_transcript("S", "C", "worker:0", "");
  std::string fitted(gate_wire::kCertMagic, gate_wire::kMagicBytes);
  const auto body = bytes.substr(0, gate_wire::kMaxCertBytes);
  const std::size_t cert = body.size() / 2, sig = std::max<std::size_t>(body.size() - cert, 1);
  for (const auto n : {std::max<std::size_t>(cert, 1), sig}) {
    fitted += static_cast<char>((n >> 8) & 0xff);
    fitted += static_cast<char>(n & 0xff);
  }
  fitted += body;
  fitted.resize(gate_wire::kCertHeaderBytes + std::max<std::size_t>(cert, 1) + sig, '\0');
  for (std::string_view frame : {bytes, std::string_view(fitted)})
    if (gate_certificate::check_proof(listening, frame, transcript, "worker:0").empty())
      throw std::logic_error("a certificate proof accepted without the CA's key");
  return false;
}

// The input as a request (cut or zero-padded to its size, and as it is)
// from a task proved as worker:0, answered by a job CA; and as the answer an
// enrolling worker:0 reads: a certificate only when it names worker:0, is
// for its key and is signed by the CA the answer carries.
inline bool enrol_frames(std::string_view bytes) {
  static const job_authority ca;
  static const task_key key;
  std::string sized(bytes.substr(0, launch_enrol::kFrameBytes));
  sized.resize(launch_enrol::kFrameBytes, '\0');
  bool any = false;
  for (std::string_view request : {std::string_view(sized), bytes}) {
    std::string refusal;
    const auto reply = launch_enrol::answer(ca, "worker:0", request, refusal);
    if (reply.size() < rendezvous_wire::kReplyHeaderBytes)
      throw std::logic_error("an answer without its header");
    any |= refusal.empty();
  }
  std::string problem;
  const auto id = launch_enrol::identity_of_reply(bytes, "worker:0", key, problem);
  if (problem.empty() && check_task_identity(id) != "")
    throw std::logic_error("an identity trusted past its check");
  return any || problem.empty();
}

namespace detail {
struct message_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  message_system() {
    register_messages(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};
// Never destroyed: libFuzzer ends the process with exit(), and an actor
// system torn down by static destructors crashes inside CAF.
inline caf::actor_system& fuzz_system() {
  static message_system* s = new message_system;
  return *s->sys;
}
template <class T>
bool load_as(std::string_view bytes) {
  T x;
  caf::binary_deserializer src{fuzz_system(), bytes.data(), bytes.size()};
  return !src(x);
}
}  // namespace detail

inline bool message_bytes(std::string_view bytes) {
  if (bytes.empty()) return false;
  auto rest = bytes.substr(1);
  switch (static_cast<uint8_t>(bytes[0]) % 14) {
    case 0:
      return detail::load_as<tensor>(rest);
    case 1:
      return detail::load_as<named_tensor>(rest);
    case 2:
      return detail::load_as<batch>(rest);
    case 3:
      return detail::load_as<step_stats>(rest);
    case 4:
      return detail::load_as<model_state>(rest);
    case 5:
      return detail::load_as<shard_values>(rest);
    case 6:
      return detail::load_as<shard_state>(rest);
    case 7:
      return detail::load_as<shard_stats>(rest);
    case 8:
      return detail::load_as<policy_weights>(rest);
    case 9:
      return detail::load_as<episode_report>(rest);
    case 10:
      return detail::load_as<unroll>(rest);
    case 11:
      return detail::load_as<ring_chunk>(rest);
    case 12:
      return detail::load_as<node_build>(rest);
    default:
      return detail::load_as<queue_stats>(rest);
  }
}

// The input after a valid handshake (so the fuzzer reaches the checks of
// later frames) and on its own; whatever passes is never more than came in.
inline bool basp_frames(std::string_view bytes) {
  static const auto local = [] {
    caf::node_id::default_data::host_id_type host{};
    host[0] = 1;
    return serialized_node_id(caf::make_node_id(1, host));
  }();
  static const auto peer = [] {
    caf::node_id::default_data::host_id_type host{};
    host[0] = 2;
    return serialized_node_id(caf::make_node_id(2, host));
  }();
  bool any = false;
  for (auto side : {basp_guard::side::listener, basp_guard::side::connector}) {
    for (bool prefixed : {true, false}) {
      basp_guard g(side, local, "fuzz:0", 1 << 16);
      std::vector<char> out;
      if (prefixed) {
        std::string hs(32, '\0');
        hs[0] = side == basp_guard::side::listener ? 1 : 0;
        hs[7] = static_cast<char>(peer.size());
        hs.append(peer.begin(), peer.end());
        if (!g.feed(hs.data(), hs.size(), out).empty()) __builtin_trap();
      }
      const auto before = out.size();
      any |= g.feed(bytes.data(), bytes.size(), out).empty();
      if (out.size() - before > bytes.size()) __builtin_trap();
    }
  }
  return any;
}

}  // namespace troupe::fuzz
