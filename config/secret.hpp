#pragma once
// The cluster's shared secret and the join handshake built on it.
//
// Where the secret comes from (never from the command line, where `ps` shows
// it to every user of the machine):
//   - cluster.secret_file when set: the whole file, one trailing newline
//     stripped; the file must be a regular file that neither group nor others
//     may read or write (chmod 600), or it is refused, as ssh refuses keys;
//   - else the environment variable cluster.secret_env (default TROUPE_SECRET).
// A secret is refused, with an error naming the variable or the file and
// why, when it is shorter than kMinSecretBytes, when it is a placeholder
// that troupe's deploy files or docs once shipped (or looks like one:
// "replace-me", "changeme", ...), or when its estimated entropy
// (estimate_secret_entropy) is below kMinSecretBits. `openssl rand -hex 32`
// makes a good one (256 bits).
//
// The handshake (challenge/response; both sides run it, so each proves it
// knows the secret to the other):
//   verifier:  c = make_challenge()                  -> sends c
//   prover:    r = challenge_response(secret, c, me) -> sends r (and `me`)
//   verifier:  verify_challenge_response(secret, c, me, r)
// r = HMAC-SHA256(secret, "troupe-join-v1" 0 me 0 c), hex. The challenge is
// 32 fresh random bytes, so a recorded response is useless later; binding
// the prover's task name stops a response from being reflected back as the
// answer to the other side's challenge; HMAC (not SHA-256(secret||c)) has no
// length-extension weakness; the secret itself never crosses the wire. The
// cryptography is OpenSSL's, through crypto/crypto.hpp.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe {

struct cluster_spec;

// A missing, unreadable, too-open, too-short, placeholder or low-entropy
// secret; what() names the variable or the file and why.
class secret_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::size_t kMinSecretBytes = 16;
// NIST SP 800-57's floor for a key's strength; `openssl rand -hex 16` (128
// bits) passes, a phrase of words and digits does not.
inline constexpr double kMinSecretBits = 112;

// How guessable a secret is, as estimate_secret_entropy sees it.
struct secret_entropy {
  double bits = 0;           // the estimate
  std::size_t alphabet = 0;  // the symbols it draws from (16 for hex, ...)
  std::string discounted;    // what was counted as guessable: words, runs, repeats
};
// An estimate, in bits, of a secret's entropy: each byte counts
// log2(alphabet), where the alphabet is the smallest usual one holding every
// byte (hex digits 16, decimal 10, else the classes present: lowercase 26,
// uppercase 26, digits 10, punctuation and space 33, and any other byte
// makes it 256); a byte that continues a run of equal or consecutive bytes
// ("aaa", "1234") counts 1 bit; a common word ("secret", "password",
// "troupe", ...) counts 6 bits whole; a secret that repeats itself counts
// its first period only. It catches the usual mistakes (a word and a
// number, a short alphabet, a pattern); it cannot see that a phrase of
// dictionary words is guessable, so a person's invention may still pass:
// make secrets with a random generator.
secret_entropy estimate_secret_entropy(std::string_view secret);

// The checks above on `secret`, as read from `source` (e.g. "the
// environment variable TROUPE_SECRET"); returns it or throws secret_error.
std::string check_cluster_secret(std::string secret, const std::string& source);

// The secret for `spec` from secret_file or secret_env (see above); throws
// secret_error.
std::string load_cluster_secret(const cluster_spec& spec);

// 32 random bytes (crypto::random_bytes), as 64 hex digits; throws
// crypto::crypto_error when none can be had.
std::string make_challenge();
// The prover's answer to `challenge`, as 64 hex digits; `prover` is the
// answering task's name (e.g. "worker:1").
std::string challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover);
// The verifier's check, in constant time; false for a wrong secret, another
// challenge or prover, or an empty/garbled response.
bool verify_challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover, std::string_view response);

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
