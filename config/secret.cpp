// The cluster's shared secret: loading it, SHA-256/HMAC, the join handshake.
#include "config/secret.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "config/cluster.hpp"

namespace troupe {
namespace {

// ------------------------------------------------------------- SHA-256

constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

class sha256_state {
 public:
  void update(std::string_view data) {
    for (char c : data) {
      block_[fill_++] = static_cast<uint8_t>(c);
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
    length_ += data.size();
  }

  sha256_digest finish() {
    const uint64_t bits = length_ * 8;
    block_[fill_++] = 0x80;
    if (fill_ > 56) {
      while (fill_ < 64) block_[fill_++] = 0;
      compress();
      fill_ = 0;
    }
    while (fill_ < 56) block_[fill_++] = 0;
    for (int i = 7; i >= 0; --i) block_[fill_++] = static_cast<uint8_t>(bits >> (8 * i));
    compress();
    sha256_digest out{};
    for (std::size_t i = 0; i < 8; ++i)
      for (std::size_t b = 0; b < 4; ++b)
        out[4 * i + b] = static_cast<uint8_t>(h_[i] >> (24 - 8 * b));
    return out;
  }

 private:
  void compress() {
    std::array<uint32_t, 64> w{};
    for (std::size_t t = 0; t < 16; ++t)
      w[t] = (uint32_t{block_[4 * t]} << 24) | (uint32_t{block_[4 * t + 1]} << 16) |
             (uint32_t{block_[4 * t + 2]} << 8) | uint32_t{block_[4 * t + 3]};
    for (std::size_t t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (std::size_t t = 0; t < 64; ++t) {
      uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = h + S1 + ch + kK[t] + w[t];
      uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      uint32_t t2 = S0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> block_{};
  std::size_t fill_ = 0;
  uint64_t length_ = 0;
};

std::string_view as_view(const sha256_digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

std::string mode_string(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

std::string check_secret(std::string s, const std::string& source) {
  if (s.empty()) throw secret_error(source + " is empty; the cluster secret must not be empty");
  if (s.size() < kMinSecretBytes)
    throw secret_error(source + " holds a " + std::to_string(s.size()) +
                       "-byte secret; use at least " + std::to_string(kMinSecretBytes) +
                       " bytes (e.g. `openssl rand -hex 16`)");
  return s;
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
  return check_secret(std::move(out), what);
}

}  // namespace

sha256_digest sha256(std::string_view data) {
  sha256_state s;
  s.update(data);
  return s.finish();
}

sha256_digest hmac_sha256(std::string_view key, std::string_view message) {
  std::array<uint8_t, 64> k{};
  if (key.size() > 64) {
    auto d = sha256(key);
    std::copy(d.begin(), d.end(), k.begin());
  } else {
    for (std::size_t i = 0; i < key.size(); ++i) k[i] = static_cast<uint8_t>(key[i]);
  }
  std::string ipad(64, '\0'), opad(64, '\0');
  for (std::size_t i = 0; i < 64; ++i) {
    ipad[i] = static_cast<char>(k[i] ^ 0x36);
    opad[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  sha256_state inner;
  inner.update(ipad);
  inner.update(message);
  auto ih = inner.finish();
  sha256_state outer;
  outer.update(opad);
  outer.update(as_view(ih));
  return outer.finish();
}

std::string to_hex(const sha256_digest& d) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Compare over the longer length so the time does not reveal where they differ.
  std::size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff |= static_cast<unsigned>(x ^ y);
  }
  // Keep the compiler from turning the loop into an early exit.
  volatile unsigned result = diff;
  return result == 0;
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
  return check_secret(v, "the environment variable " + name);
}

std::string make_challenge() {
  sha256_digest bytes{};
  std::size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  return to_hex(bytes);
}

std::string challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover) {
  std::string msg = "troupe-join-v1";
  msg += '\0';
  msg += prover;
  msg += '\0';
  msg += challenge;
  return to_hex(hmac_sha256(secret, msg));
}

bool verify_challenge_response(std::string_view secret, std::string_view challenge,
                               std::string_view prover, std::string_view response) {
  if (secret.empty() || challenge.empty()) return false;
  return constant_time_equal(challenge_response(secret, challenge, prover), response);
}

std::string hkdf_sha256(std::string_view salt, std::string_view ikm, std::string_view info,
                        std::size_t length) {
  if (length > 255 * 32) throw std::invalid_argument("hkdf_sha256: at most 8160 bytes");
  // Extract: an empty salt is a string of HashLen zeros (RFC 5869 2.2).
  const std::string zeros(32, '\0');
  const auto prk = hmac_sha256(salt.empty() ? std::string_view(zeros) : salt, ikm);
  // Expand: T(i) = HMAC(PRK, T(i-1) | info | i).
  std::string out, t;
  for (uint8_t i = 1; out.size() < length; ++i) {
    std::string block = t;
    block.append(info);
    block += static_cast<char>(i);
    auto d = hmac_sha256(as_view(prk), block);
    t.assign(as_view(d));
    out += t;
  }
  out.resize(length);
  return out;
}

std::string derive_key(std::string_view secret, std::string_view purpose) {
  return hkdf_sha256("troupe-cluster-secret-kdf", secret, purpose, 32);
}

}  // namespace troupe
