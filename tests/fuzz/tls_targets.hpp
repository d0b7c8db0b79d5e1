#pragma once
// What a network peer (or anyone on the path) can put in a TLS link's
// stream after the handshake: the bytes our TLS 1.3 record reader opens
// (net/tls_records.hpp).
//   - tls_records: the input as a record stream, whole and cut at a point
//     the input picks; then the input as plaintext, sealed and opened again,
//     which must give it back exactly (a mismatch aborts: a finding), with
//     a key update every few records (how many, the input picks). The
//     whole stream is also read by a reader that opens runs of records as
//     a pool's parts (a pool without helpers: the same code, no threads),
//     which must say and give what the one-by-one reader does.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "net/fork_join_pool.hpp"
#include "net/tls_records.hpp"

namespace troupe::fuzz {

inline bool tls_records(std::string_view bytes) {
  static const std::string secret(32, '\x5a');
  static fork_join_pool caller_only(0);
  bool any = false;
  {
    tls13::record_reader whole(secret), in_runs(secret, &caller_only);
    std::vector<char> out, out_runs;
    const auto why = whole.feed(bytes.data(), bytes.size(), out);
    if (in_runs.feed(bytes.data(), bytes.size(), out_runs) != why || out_runs != out ||
        in_runs.closed() != whole.closed())
      std::abort();  // opening records side by side must change nothing
    any |= why.empty();
  }
  if (!bytes.empty()) {
    tls13::record_reader cut(secret);
    std::vector<char> out;
    const std::size_t at = static_cast<unsigned char>(bytes[0]) % bytes.size();
    if (cut.feed(bytes.data(), at, out).empty())
      any |= cut.feed(bytes.data() + at, bytes.size() - at, out).empty();
  }
  const uint64_t records_per_key =
      2 + (bytes.empty() ? 0 : static_cast<unsigned char>(bytes[0]) % 6);
  tls13::record_writer writer(secret, &caller_only, records_per_key);
  tls13::record_reader reader(secret);
  std::vector<char> sealed, opened;
  writer.seal(bytes.data(), bytes.size(), sealed);
  writer.seal_close_notify(sealed);
  if (!reader.feed(sealed.data(), sealed.size(), opened).empty() || !reader.closed() ||
      reader.key_updates() != writer.key_updates() ||
      std::string_view(opened.data(), opened.size()) != bytes)
    std::abort();  // our own records must come back as they went
  return any;
}

}  // namespace troupe::fuzz
