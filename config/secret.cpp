// The cluster's shared secret: loading and judging it, the join handshake.
#include "config/secret.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "config/cluster.hpp"
#include "crypto/crypto.hpp"

namespace troupe {
namespace {

// Values troupe's own files shipped as examples: a deployment that kept one
// runs with a secret anyone can read.
struct shipped_placeholder {
  std::string_view value, where;
};
constexpr std::array<shipped_placeholder, 1> kShippedPlaceholders = {
    {{"replace-me-with-openssl-rand-hex-32", "an earlier deploy/kubernetes/secret.yaml"}}};
// Parts of a value that mark a placeholder nobody replaced.
constexpr std::array<std::string_view, 9> kPlaceholderMarks = {
    "replace-me", "replace_me",  "replaceme",   "changeme", "change-me",
    "change_me",  "your-secret", "your_secret", "<secret>"};
// Common words, counted whole wherever they appear (any case).
constexpr std::array<std::string_view, 24> kCommonWords = {
    "password", "passwd",  "secret", "changeme", "replace", "example", "sample", "default",
    "troupe",   "cluster", "worker", "chief",    "admin",   "letmein", "qwerty", "token",
    "hunter",   "dragon",  "master", "welcome",  "test",    "demo",    "local",  "pass"};
constexpr double kWordBits = 6;  // about log2 of a short list of likely words, and a case

char lower_ascii(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

bool contains_folded(std::string_view haystack, std::string_view needle) {
  for (std::size_t i = 0; i + needle.size() <= haystack.size(); ++i) {
    std::size_t k = 0;
    while (k < needle.size() && lower_ascii(haystack[i + k]) == needle[k]) ++k;
    if (k == needle.size()) return true;
  }
  return false;
}

// Why `s` is a placeholder, or "".
std::string placeholder_problem(std::string_view s) {
  for (const auto& p : kShippedPlaceholders)
    if (s == p.value)
      return "the placeholder secret shipped in " + std::string(p.where) + " (\"" +
             std::string(p.value) + "\"), public to anyone who read that file";
  for (auto mark : kPlaceholderMarks)
    if (contains_folded(s, mark))
      return "a placeholder secret (it contains \"" + std::string(mark) + "\")";
  return "";
}

// The smallest usual alphabet holding every byte of `s` (see the header).
std::size_t alphabet_of(std::string_view s) {
  bool lower = false, upper = false, digit = false, punct = false, other = false;
  bool hex_lower = true, hex_upper = true;
  for (unsigned char c : s) {
    const bool d = c >= '0' && c <= '9', l = c >= 'a' && c <= 'z', u = c >= 'A' && c <= 'Z';
    digit |= d;
    lower |= l;
    upper |= u;
    punct |= !d && !l && !u && c >= 0x20 && c < 0x7f;
    other |= c < 0x20 || c >= 0x7f;
    hex_lower &= d || (c >= 'a' && c <= 'f');
    hex_upper &= d || (c >= 'A' && c <= 'F');
  }
  if (other) return 256;
  if (digit && !lower && !upper && !punct) return 10;
  if (hex_lower || hex_upper) return 16;
  return (lower ? 26 : 0) + (upper ? 26 : 0) + (digit ? 10 : 0) + (punct ? 33 : 0);
}

// The shortest p (up to 256) with s[i] == s[i - p] throughout: a secret made
// of one piece repeated; s.size() when there is none.
std::size_t period_of(std::string_view s) {
  const std::size_t longest = std::min<std::size_t>(s.size() / 2, 256);
  for (std::size_t p = 1; p <= longest; ++p) {
    bool periodic = true;
    for (std::size_t i = p; i < s.size() && periodic; ++i) periodic = s[i] == s[i - p];
    if (periodic) return p;
  }
  return s.size();
}

// The common word starting at s[i], or "".
std::string_view word_at(std::string_view s, std::size_t i) {
  for (auto w : kCommonWords)
    if (i + w.size() <= s.size() && contains_folded(s.substr(i, w.size()), w)) return w;
  return {};
}

// s[i] continues a run begun by the two bytes before it: equal or
// consecutive bytes ("aaa", "123", "cba").
bool continues_run(std::string_view s, std::size_t i) {
  if (i < 2) return false;
  const int d1 = static_cast<unsigned char>(s[i]) - static_cast<unsigned char>(s[i - 1]);
  const int d2 = static_cast<unsigned char>(s[i - 1]) - static_cast<unsigned char>(s[i - 2]);
  return d1 == d2 && d1 >= -1 && d1 <= 1;
}

// Adds `what` to a comma-separated list, once.
void note(std::string& list, const std::string& what) {
  if (list.find(what) != std::string::npos) return;
  if (!list.empty()) list += ", ";
  list += what;
}

std::string mode_string(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

std::string read_secret_file(const std::string& file) {
  const std::string what = "cluster.secret_file \"" + file + "\"";
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    throw secret_error("cannot open " + what + ": " + std::strerror(errno) +
                       (errno == ELOOP ? " (a symbolic link is not accepted)" : ""));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw secret_error("cannot stat " + what + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw secret_error(what + " is not a regular file");
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    ::close(fd);
    throw secret_error("permissions " + mode_string(st.st_mode) + " for " + what +
                       " are too open: group and others must have no access "
                       "(chmod 600 the file)");
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw secret_error("cannot read " + what + ": " + std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (1 << 20)) {
      ::close(fd);
      throw secret_error(what + " is larger than 1 MiB; expected a short secret");
    }
  }
  ::close(fd);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  if (!out.empty() && out.back() == '\r') out.pop_back();
  return check_cluster_secret(std::move(out), what);
}

}  // namespace

secret_entropy estimate_secret_entropy(std::string_view secret) {
  secret_entropy e;
  if (secret.empty()) return e;
  e.alphabet = alphabet_of(secret);
  const double per_byte = std::log2(static_cast<double>(e.alphabet));
  const std::size_t period = period_of(secret);
  const std::string_view s = secret.substr(0, period);
  if (period < secret.size())
    note(e.discounted, "a repeat of its first " + std::to_string(period) + " byte(s)");
  std::size_t run_bytes = 0, runs = 0;
  for (std::size_t i = 0; i < s.size();) {
    if (auto w = word_at(s, i); !w.empty()) {
      e.bits += kWordBits;
      note(e.discounted, "the word \"" + std::string(w) + "\"");
      i += w.size();
    } else if (continues_run(s, i)) {
      e.bits += 1;
      runs += continues_run(s, i - 1) ? 0 : 1;
      ++run_bytes;
      ++i;
    } else {
      e.bits += per_byte;
      ++i;
    }
  }
  if (runs > 0)
    note(e.discounted, std::to_string(runs) + " run(s) of equal or consecutive bytes (" +
                           std::to_string(run_bytes) + " byte(s) at 1 bit)");
  return e;
}

std::string check_cluster_secret(std::string s, const std::string& source) {
  constexpr const char* make_one = "make one with `openssl rand -hex 32`";
  if (s.empty()) throw secret_error(source + " is empty; the cluster secret must not be empty");
  if (s.size() < kMinSecretBytes)
    throw secret_error(source + " holds a " + std::to_string(s.size()) +
                       "-byte secret; use at least " + std::to_string(kMinSecretBytes) +
                       " bytes (" + make_one + ")");
  if (auto why = placeholder_problem(s); !why.empty())
    throw secret_error(source + " holds " + why + "; " + make_one);
  const auto e = estimate_secret_entropy(s);
  if (e.bits < kMinSecretBits) {
    char bits[32];
    std::snprintf(bits, sizeof bits, "%.0f", std::floor(e.bits));
    throw secret_error(source + " holds a guessable secret: about " + bits +
                       " bits of entropy by troupe's estimate (" + std::to_string(s.size()) +
                       " bytes from a " + std::to_string(e.alphabet) + "-symbol alphabet" +
                       (e.discounted.empty() ? "" : "; less for " + e.discounted) +
                       "), under the " + std::to_string(int(kMinSecretBits)) + " bits required; " +
                       make_one);
  }
  return s;
}

std::string load_cluster_secret(const cluster_spec& spec) {
  if (!spec.secret_file.empty()) return read_secret_file(spec.secret_file);
  const std::string& name =
      spec.secret_env.empty() ? std::string("TROUPE_SECRET") : spec.secret_env;
  const char* v = std::getenv(name.c_str());
  if (!v)
    throw secret_error("no cluster secret: the environment variable " + name +
                       " is not set and cluster.secret_file is empty (set one of them; the "
                       "secret is never taken from the command line)");
  return check_cluster_secret(v, "the environment variable " + name);
}

std::string make_challenge() {
  return crypto::to_hex(crypto::random_bytes(32));
}

std::string challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover) {
  std::string msg = "troupe-join-v1";
  msg += '\0';
  msg += prover;
  msg += '\0';
  msg += challenge;
  return crypto::to_hex(crypto::hmac_sha256(secret, msg));
}

bool verify_challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover, std::string_view response) {
  if (secret.empty() || challenge.empty()) return false;
  return crypto::constant_time_equal(challenge_response(secret, challenge, prover), response);
}

std::string derive_key(std::string_view secret, std::string_view purpose) {
  return crypto::hkdf("troupe-cluster-secret-kdf", secret, purpose, 32);
}

}  // namespace troupe
