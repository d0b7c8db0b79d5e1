// The gate's frames (net/gate.hpp): pure functions over bytes, no sockets
// and no CAF, so that the fuzz target can link them alone.
#include <algorithm>
#include <cstring>

#include "config/secret.hpp"
#include "net/gate.hpp"

namespace troupe::gate_wire {

namespace {

std::string fixed_name(const std::string& name) {
  std::string out(kNameBytes, '\0');
  std::memcpy(out.data(), name.data(), std::min(name.size(), kNameBytes - 1));
  return out;
}

// The name in a fixed, NUL-padded field: printable, non-empty, terminated;
// else empty.
std::string read_name(std::string_view field) {
  auto end = field.find('\0');
  if (end == std::string_view::npos || end == 0) return {};
  for (std::size_t i = end; i < field.size(); ++i)
    if (field[i] != '\0') return {};
  auto name = field.substr(0, end);
  for (char ch : name)
    if (ch < 0x21 || ch > 0x7e) return {};
  return std::string(name);
}

bool is_hex64(std::string_view s) {
  return s.size() == kHexBytes && std::all_of(s.begin(), s.end(), [](char ch) {
           return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
         });
}

bool has_magic(std::string_view frame) {
  return frame.size() >= kMagicBytes && frame.substr(0, kMagicBytes) == kMagic;
}

// The name in a fixed field that may also be empty (all NULs): the proof's
// target when the connector accepts any task.
std::string read_optional_name(std::string_view field, bool* ok) {
  *ok = true;
  if (field.find_first_not_of('\0') == std::string_view::npos) return {};
  auto name = read_name(field);
  *ok = !name.empty();
  return name;
}

// What each side's HMAC covers: both challenges, in an order and with a label
// of its own, so a proof of one direction never answers the other; the
// connector's also the task it dialed, the listener's also its verdict.
std::string client_label(const std::string& server_challenge, const std::string& client_challenge,
                         const std::string& target) {
  return "gate-client|" + server_challenge + "|" + client_challenge + "|" + target;
}
std::string server_label(const std::string& server_challenge, const std::string& client_challenge,
                         char verdict) {
  return "gate-server|" + client_challenge + "|" + server_challenge + "|" + verdict;
}

}  // namespace

std::string make_hello(const std::string& server_challenge) {
  return std::string(kMagic, kMagicBytes) + server_challenge;
}

std::string check_hello(std::string_view frame) {
  if (frame.size() != kHelloBytes || !has_magic(frame)) return {};
  auto challenge = frame.substr(kMagicBytes);
  return is_hex64(challenge) ? std::string(challenge) : std::string{};
}

std::string make_proof(const std::string& key, const std::string& name, const std::string& target,
                       const std::string& server_challenge, const std::string& client_challenge) {
  std::string p(kMagic, kMagicBytes);
  p += fixed_name(name);
  p += fixed_name(target);
  p += client_challenge;
  p += challenge_response(key, client_label(server_challenge, client_challenge, target), name);
  return p;
}

proof_check check_proof(const std::string& key, const std::string& server_challenge,
                        std::string_view frame) {
  proof_check out;
  if (frame.size() != kProofBytes || !has_magic(frame)) {
    out.problem = "not a troupe peer (no gate handshake)";
    return out;
  }
  std::size_t at = kMagicBytes;
  auto name = read_name(frame.substr(at, kNameBytes));
  at += kNameBytes;
  bool target_ok = false;
  auto target = read_optional_name(frame.substr(at, kNameBytes), &target_ok);
  at += kNameBytes;
  auto challenge = frame.substr(at, kHexBytes);
  auto mac = frame.substr(at + kHexBytes, kHexBytes);
  if (name.empty() || !target_ok || !is_hex64(challenge) || !is_hex64(mac)) {
    out.problem = "malformed gate handshake";
    return out;
  }
  out.well_formed = true;
  out.name = name;
  out.target = target;
  out.client_challenge = std::string(challenge);
  if (!verify_challenge_response(
          key, client_label(server_challenge, out.client_challenge, out.target), name, mac)) {
    out.problem = "wrong or missing cluster secret";
    out.name.clear();  // unproven: who it claims to be, or to dial, is not to be trusted
    out.target.clear();
  }
  return out;
}

std::string make_verdict(bool admitted, const std::string& key, const std::string& name,
                         const std::string& server_challenge, const std::string& client_challenge) {
  std::string v(kMagic, kMagicBytes);
  const char letter = admitted ? 'A' : 'R';
  v += letter;
  v += fixed_name(name);
  v += challenge_response(key, server_label(server_challenge, client_challenge, letter), name);
  return v;
}

verdict_check check_verdict(const std::string& key, const std::string& server_challenge,
                            const std::string& client_challenge, std::string_view frame) {
  verdict_check out;
  if (frame.size() != kVerdictBytes || !has_magic(frame)) {
    out.problem = "is not a troupe node (no gate handshake)";
    return out;
  }
  const char letter = frame[kMagicBytes];
  if (letter != 'A' && letter != 'R') {
    out.problem = "is not a troupe node (no gate handshake)";
    return out;
  }
  auto name = read_name(frame.substr(kMagicBytes + 1, kNameBytes));
  auto mac = frame.substr(kMagicBytes + 1 + kNameBytes);
  out.authentic = !name.empty() &&
                  verify_challenge_response(
                      key, server_label(server_challenge, client_challenge, letter), name, mac);
  if (out.authentic) out.name = name;
  if (letter == 'R') {
    out.problem = out.authentic
                      ? "refused this process (" + name +
                            " named it not a task of its cluster, "
                            "or not the task it dialed)"
                      : "refused this process: wrong or missing cluster secret (an unauthenticated "
                        "refusal)";
    return out;
  }
  if (!out.authentic) out.problem = "did not prove it knows the cluster secret";
  return out;
}

bool names_refusal(std::string_view error) {
  return error.find("refused this process") != std::string_view::npos ||
         error.find("secret") != std::string_view::npos ||
         error.find("TLS") != std::string_view::npos;
}

std::string certificate_transcript(const std::string& server_challenge,
                                   const std::string& client_challenge, const std::string& name,
                                   const std::string& target) {
  std::string t = "gate-certificate";
  for (const auto* part : {&server_challenge, &client_challenge, &name, &target}) {
    t += '\0';
    t += *part;
  }
  return t;
}

std::string make_certificate_proof(std::string_view certificate, std::string_view signature) {
  std::string out(kCertMagic, kMagicBytes);
  for (const auto n : {certificate.size(), signature.size()}) {
    out += static_cast<char>((n >> 8) & 0xff);
    out += static_cast<char>(n & 0xff);
  }
  out += certificate;
  out += signature;
  return out;
}

namespace {
// A big-endian 2-byte length at `i`.
std::size_t length_at(std::string_view bytes, std::size_t i) {
  return (std::size_t{static_cast<uint8_t>(bytes[i])} << 8) | static_cast<uint8_t>(bytes[i + 1]);
}
}  // namespace

int64_t certificate_proof_length(std::string_view header) {
  if (header.size() != kCertHeaderBytes || header.substr(0, kMagicBytes) != kCertMagic) return -1;
  const std::size_t cert = length_at(header, kMagicBytes), sig = length_at(header, kMagicBytes + 2);
  if (cert == 0 || sig == 0 || cert > kMaxCertBytes || sig > kMaxCertSignatureBytes) return -1;
  return static_cast<int64_t>(cert + sig);
}

std::optional<certificate_proof_parts> split_certificate_proof(std::string_view frame) {
  const auto length = certificate_proof_length(frame.substr(0, kCertHeaderBytes));
  if (length < 0 || frame.size() != kCertHeaderBytes + static_cast<std::size_t>(length))
    return std::nullopt;
  const std::size_t cert = length_at(frame, kMagicBytes);
  return certificate_proof_parts{frame.substr(kCertHeaderBytes, cert),
                                 frame.substr(kCertHeaderBytes + cert)};
}

}  // namespace troupe::gate_wire
