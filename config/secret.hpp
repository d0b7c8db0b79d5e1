#pragma once
// The cluster's shared secret and the join handshake built on it.
//
// Where the secret comes from (never from the command line, where `ps` shows
// it to every user of the machine):
//   - cluster.secret_file when set: the whole file, one trailing newline
//     stripped; the file must be a regular file that neither group nor others
//     may read or write (chmod 600), or it is refused, as ssh refuses keys;
//   - else the environment variable cluster.secret_env (default TROUPE_SECRET).
// A secret must be at least kMinSecretBytes long (`openssl rand -hex 16`).
//
// The handshake (challenge/response; both sides run it, so each proves it
// knows the secret to the other):
//   verifier:  c = make_challenge()                  -> sends c
//   prover:    r = challenge_response(secret, c, me) -> sends r (and `me`)
//   verifier:  verify_challenge_response(secret, c, me, r)
// r = HMAC-SHA256(secret, "troupe-join-v1" 0 me 0 c), hex. The challenge is
// 32 fresh random bytes (getrandom), so a recorded response is useless later;
// binding the prover's task name stops a response from being reflected back
// as the answer to the other side's challenge; HMAC (not SHA-256(secret||c))
// has no length-extension weakness; the secret itself never crosses the wire.
// SHA-256 and HMAC are implemented here (FIPS 180-4, RFC 2104) so the project
// needs no crypto library.
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe {

struct cluster_spec;

// A missing, unreadable, too-open or too-short secret; what() names the
// variable or the file.
class secret_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::size_t kMinSecretBytes = 16;

// The secret for `spec` from secret_file or secret_env (see above); throws
// secret_error.
std::string load_cluster_secret(const cluster_spec& spec);

// True when a == b, in time that depends only on the lengths.
bool constant_time_equal(std::string_view a, std::string_view b);

using sha256_digest = std::array<uint8_t, 32>;
sha256_digest sha256(std::string_view data);
sha256_digest hmac_sha256(std::string_view key, std::string_view message);
std::string to_hex(const sha256_digest& d);  // 64 lowercase hex digits

// 32 random bytes from the kernel (getrandom), as 64 hex digits; throws
// std::runtime_error when the kernel cannot supply them.
std::string make_challenge();
// The prover's answer to `challenge`, as 64 hex digits; `prover` is the
// answering task's name (e.g. "worker:1").
std::string challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover);
// The verifier's check, in constant time; false for a wrong secret, another
// challenge or prover, or an empty/garbled response.
bool verify_challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover, std::string_view response);

// HKDF-SHA256 (RFC 5869): `length` (at most 255 * 32) bytes of key material
// from `ikm`, bound to `salt` and `info`.
std::string hkdf_sha256(std::string_view salt, std::string_view ikm, std::string_view info,
                        std::size_t length);

// What each derived key is for. One secret, one KDF, a key per purpose, so a
// MAC computed for one purpose (a gate proof, the node handshake, the TLS
// pre-shared key) is never valid for another: a peer that makes a node sign
// something in one protocol learns nothing it can use in the others.
namespace key_purpose {
inline constexpr std::string_view gate = "troupe gate v2";
inline constexpr std::string_view node_handshake = "troupe node handshake v2";
inline constexpr std::string_view tls_psk = "troupe tls13 psk v1";
}  // namespace key_purpose

// 32 bytes derived from the cluster secret for `purpose` (key_purpose::...),
// with HKDF-SHA256 and a fixed troupe salt; the raw secret is never used as a
// key.
std::string derive_key(std::string_view secret, std::string_view purpose);

}  // namespace troupe
