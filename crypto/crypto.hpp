#pragma once
// troupe's one door to cryptography: SHA-256 (one-shot and streaming),
// HMAC-SHA256, HKDF-SHA256 (RFC 5869) with TLS 1.3's HKDF-Expand-Label
// (RFC 8446 section 7.1), comparison in constant time, random bytes and
// wiping, all over OpenSSL 3's EVP interfaces (no cryptography of our own).
// A leaf: it depends on OpenSSL only, and every other library that needs a
// digest, a MAC or a key derivation calls it (config's secret, the gate,
// the TLS record layer, checkpoint checksums).
//
// Errors from OpenSSL (it cannot allocate, a provider is missing) throw
// crypto_error, naming the operation.
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

typedef struct evp_md_ctx_st EVP_MD_CTX;  // as OpenSSL's <openssl/types.h>

namespace troupe::crypto {

class crypto_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::size_t sha256_size = 32;
using sha256_digest = std::array<uint8_t, sha256_size>;

// SHA-256 of `data` (FIPS 180-4).
sha256_digest sha256(std::string_view data);

// SHA-256 over data given in pieces: the digest of their concatenation.
class sha256_stream {
 public:
  sha256_stream();
  ~sha256_stream();
  sha256_stream(const sha256_stream&) = delete;
  sha256_stream& operator=(const sha256_stream&) = delete;
  void update(std::string_view data);
  // The digest of everything given so far; the stream then starts afresh.
  sha256_digest finish();

 private:
  EVP_MD_CTX* ctx_;
};

// HMAC-SHA256(key, message) (RFC 2104; test vectors of RFC 4231).
sha256_digest hmac_sha256(std::string_view key, std::string_view message);

// HKDF-Extract (RFC 5869 2.2): the 32-byte pseudorandom key; an empty salt
// is HashLen zero bytes.
std::string hkdf_extract(std::string_view salt, std::string_view ikm);
// HKDF-Expand (RFC 5869 2.3): `length` bytes (at most 255 * 32) from `prk`
// (at least 32 bytes) and `info`; throws std::invalid_argument otherwise.
std::string hkdf_expand(std::string_view prk, std::string_view info, std::size_t length);
// Extract then expand.
std::string hkdf(std::string_view salt, std::string_view ikm, std::string_view info,
                 std::size_t length);
// HKDF-Expand-Label(secret, label, context, length) of TLS 1.3 over SHA-256
// (RFC 8446 7.1): the label is prefixed with "tls13 ".
std::string hkdf_expand_label(std::string_view secret, std::string_view label,
                              std::string_view context, std::size_t length);

// True when a == b. The time depends on the lengths only (which are not
// secret here: MACs and digests of a fixed size), never on where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);

// `n` bytes from OpenSSL's CSPRNG (seeded by the kernel, reseeded after a
// fork); throws crypto_error when it cannot supply them.
std::string random_bytes(std::size_t n);
void random_bytes(void* out, std::size_t n);

// Overwrites memory that held a key, in a way the compiler keeps.
void cleanse(void* p, std::size_t n);
void cleanse(std::string& s);  // its bytes, then clears it

// Lowercase hex of `bytes` (two digits a byte).
std::string to_hex(std::string_view bytes);
std::string to_hex(const sha256_digest& d);
// The digest's bytes as a string (e.g. a key for hkdf_expand).
std::string as_string(const sha256_digest& d);

}  // namespace troupe::crypto
