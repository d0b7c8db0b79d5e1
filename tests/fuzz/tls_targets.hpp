#pragma once
// What a network peer (or anyone on the path) can put in a TLS link's
// stream after the handshake: the bytes our TLS 1.3 record reader opens
// (runtime/tls_records.hpp).
//   - tls_records: the input as a record stream, whole and cut at a point
//     the input picks; then the input as plaintext, sealed and opened again,
//     which must give it back exactly (a mismatch aborts: a finding).
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tls_records.hpp"

namespace troupe::fuzz {

inline bool tls_records(std::string_view bytes) {
  static const std::string secret(32, '\x5a');
  bool any = false;
  {
    tls13::record_reader whole(secret);
    std::vector<char> out;
    any |= whole.feed(bytes.data(), bytes.size(), out).empty();
  }
  if (!bytes.empty()) {
    tls13::record_reader cut(secret);
    std::vector<char> out;
    const std::size_t at = static_cast<unsigned char>(bytes[0]) % bytes.size();
    if (cut.feed(bytes.data(), at, out).empty())
      any |= cut.feed(bytes.data() + at, bytes.size() - at, out).empty();
  }
  tls13::record_writer writer(secret);
  tls13::record_reader reader(secret);
  std::vector<char> sealed, opened;
  writer.seal(bytes.data(), bytes.size(), sealed);
  writer.seal_close_notify(sealed);
  if (!reader.feed(sealed.data(), sealed.size(), opened).empty() || !reader.closed() ||
      std::string_view(opened.data(), opened.size()) != bytes)
    std::abort();  // our own records must come back as they went
  return any;
}

}  // namespace troupe::fuzz
