// The rendezvous' frames (net/rendezvous.hpp): pure functions over bytes,
// no sockets, so that the fuzz target can link them alone.
#include <algorithm>
#include <cstring>

#include "net/rendezvous.hpp"

namespace troupe::rendezvous_wire {

namespace {

void put_u64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(std::string_view b) {
  uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(b[i]);
  return v;
}

bool has_magic(std::string_view frame) {
  return frame.size() >= kMagicBytes && frame.substr(0, kMagicBytes) == kMagic;
}

}  // namespace

std::string make_request(int64_t rank, int64_t world_size, const std::string& address,
                         const std::string& public_key) {
  std::string out(kMagic, kMagicBytes);
  put_u64(out, static_cast<uint64_t>(rank));
  put_u64(out, static_cast<uint64_t>(world_size));
  std::string field(kAddressBytes, '\0');
  std::memcpy(field.data(), address.data(), std::min(address.size(), kAddressBytes - 1));
  std::string key(kPublicKeyBytes, '\0');
  std::memcpy(key.data(), public_key.data(), std::min(public_key.size(), kPublicKeyBytes));
  return out + field + key;
}

std::string make_announce(int64_t rank, int64_t world_size, const std::string& address,
                          const std::string& public_key, const std::string& signature) {
  std::string sig(kSignatureBytes, '\0');
  std::memcpy(sig.data(), signature.data(), std::min(signature.size(), kSignatureBytes));
  return make_request(rank, world_size, address, public_key) + sig;
}

announce_check check_announce(std::string_view frame, int64_t world_size) {
  announce_check out;
  if (frame.size() != kAnnounceBytes || !has_magic(frame)) {
    out.problem = "not a rendezvous announce";
    return out;
  }
  const uint64_t rank = get_u64(frame.substr(kMagicBytes));
  const uint64_t world = get_u64(frame.substr(kMagicBytes + 8));
  auto field = frame.substr(kMagicBytes + 16, kAddressBytes);
  auto end = field.find('\0');
  if (end == std::string_view::npos || end == 0 ||
      field.find_first_not_of('\0', end) != std::string_view::npos) {
    out.problem = "a malformed address field";
    return out;
  }
  try {
    parse_host_port(field.substr(0, end));
  } catch (const std::invalid_argument& e) {
    out.problem = std::string("its address: ") + e.what();
    return out;
  }
  if (world != static_cast<uint64_t>(world_size)) {
    out.problem = "it announces a world size of " + std::to_string(world) + ", the chief's is " +
                  std::to_string(world_size);
    return out;
  }
  if (rank == 0 || rank >= world) {
    out.problem = "rank " + std::to_string(rank) + " is outside 1.." +
                  std::to_string(world_size - 1) + " (rank 0 is the chief)";
    return out;
  }
  out.rank = static_cast<int64_t>(rank);
  out.address = std::string(field.substr(0, end));
  out.request = std::string(frame.substr(0, kRequestBytes));
  out.public_key = std::string(frame.substr(kRequestBytes - kPublicKeyBytes, kPublicKeyBytes));
  out.signature = std::string(frame.substr(kRequestBytes, kSignatureBytes));
  return out;
}

std::string make_reply(const nlohmann::json& payload) {
  const auto body = payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out(kMagic, kMagicBytes);
  const auto n = static_cast<uint32_t>(body.size());
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + body;
}

int64_t reply_length(std::string_view header) {
  if (header.size() != kReplyHeaderBytes || !has_magic(header)) return -1;
  uint64_t n = 0;
  for (std::size_t i = kMagicBytes; i < kReplyHeaderBytes; ++i)
    n = (n << 8) | static_cast<uint8_t>(header[i]);
  return n > kMaxReplyBytes ? -1 : static_cast<int64_t>(n);
}

cluster_tasks tasks_of_reply(std::string_view payload) {
  auto j = nlohmann::json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw std::invalid_argument("the chief's answer is not a JSON object");
  if (auto e = j.find("error"); e != j.end() && e->is_string())
    throw std::invalid_argument("the chief refused this rank: " + e->get<std::string>());
  auto t = j.find("tasks");
  if (t == j.end() || !t->is_object())
    throw std::invalid_argument("the chief's answer has no \"tasks\" object");
  cluster_tasks tasks;
  for (const auto& [job, list] : t->items()) {
    if (!list.is_array()) throw std::invalid_argument("the chief's tasks." + job + " is no list");
    for (const auto& a : list) {
      if (!a.is_string())
        throw std::invalid_argument("the chief's tasks." + job + " holds a non-string");
      tasks[job].push_back(a.get<std::string>());
    }
  }
  return tasks;
}

}  // namespace troupe::rendezvous_wire

namespace troupe::rendezvous_wire {

issued_certificate certificate_of_reply(std::string_view payload) {
  auto j = nlohmann::json::parse(payload, nullptr, false);
  issued_certificate out;
  if (j.is_discarded() || !j.is_object()) return out;
  auto text = [&j](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  out.certificate = text("certificate");
  out.ca = text("ca");
  if (out.certificate.empty() || out.ca.empty()) out = {};
  return out;
}

}  // namespace troupe::rendezvous_wire
