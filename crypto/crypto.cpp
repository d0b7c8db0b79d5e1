// troupe::crypto over OpenSSL 3's EVP (crypto/crypto.hpp).
#include "crypto/crypto.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <climits>
#include <memory>

namespace troupe::crypto {
namespace {

[[noreturn]] void fail(const std::string& what) {
  char buf[256] = "no OpenSSL error recorded";
  if (unsigned long e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  throw crypto_error("crypto: " + what + " failed: " + buf);
}

const unsigned char* bytes_of(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

struct kdf_ctx_free {
  void operator()(EVP_KDF_CTX* c) const { EVP_KDF_CTX_free(c); }
};

// One HKDF-SHA256 call of OpenSSL's provider in `mode`
// (EVP_KDF_HKDF_MODE_*); `key` is the IKM (extract) or the PRK (expand).
std::string run_hkdf(int mode, std::string_view key, std::string_view salt, std::string_view info,
                     std::size_t length) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (!kdf) fail("fetching HKDF");
  std::unique_ptr<EVP_KDF_CTX, kdf_ctx_free> ctx(EVP_KDF_CTX_new(kdf));
  EVP_KDF_free(kdf);
  if (!ctx) fail("HKDF context");
  char digest[] = "SHA256";
  // OpenSSL takes the octet strings as void*; it only reads them.
  auto octets = [](const char* name, std::string_view s) {
    return OSSL_PARAM_construct_octet_string(name, const_cast<char*>(s.data()), s.size());
  };
  OSSL_PARAM params[6];
  std::size_t n = 0;
  params[n++] = OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode);
  params[n++] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
  params[n++] = octets(OSSL_KDF_PARAM_KEY, key);
  if (!salt.empty()) params[n++] = octets(OSSL_KDF_PARAM_SALT, salt);
  if (!info.empty()) params[n++] = octets(OSSL_KDF_PARAM_INFO, info);
  params[n] = OSSL_PARAM_construct_end();
  std::string out(length, '\0');
  if (EVP_KDF_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), out.size(), params) !=
      1) {
    cleanse(out);
    fail("HKDF-SHA256");
  }
  return out;
}

}  // namespace

sha256_digest sha256(std::string_view data) {
  sha256_digest out{};
  std::size_t len = 0;
  if (EVP_Q_digest(nullptr, "SHA256", nullptr, data.data(), data.size(), out.data(), &len) != 1 ||
      len != out.size())
    fail("SHA-256");
  return out;
}

sha256_stream::sha256_stream() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    fail("SHA-256 context");
  }
}

sha256_stream::~sha256_stream() {
  EVP_MD_CTX_free(ctx_);
}

void sha256_stream::update(std::string_view data) {
  if (EVP_DigestUpdate(ctx_, data.data(), data.size()) != 1) fail("SHA-256 update");
}

sha256_digest sha256_stream::finish() {
  sha256_digest out{};
  unsigned len = 0;
  if (EVP_DigestFinal_ex(ctx_, out.data(), &len) != 1 || len != out.size() ||
      EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
    fail("SHA-256 final");
  return out;
}

sha256_digest hmac_sha256(std::string_view key, std::string_view message) {
  sha256_digest out{};
  std::size_t len = 0;
  // An empty key is HMAC's zero-padded block, as RFC 2104 says; OpenSSL
  // wants a non-null pointer for it.
  static const unsigned char no_key = 0;
  if (!EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, key.empty() ? &no_key : bytes_of(key),
                 key.size(), bytes_of(message), message.size(), out.data(), out.size(), &len) ||
      len != out.size())
    fail("HMAC-SHA256");
  return out;
}

std::string hkdf_extract(std::string_view salt, std::string_view ikm) {
  return run_hkdf(EVP_KDF_HKDF_MODE_EXTRACT_ONLY, ikm, salt, {}, sha256_size);
}

std::string hkdf_expand(std::string_view prk, std::string_view info, std::size_t length) {
  if (prk.size() < sha256_size)
    throw std::invalid_argument("HKDF-Expand: the pseudorandom key has " +
                                std::to_string(prk.size()) + " bytes, fewer than 32");
  if (length == 0 || length > 255 * sha256_size)
    throw std::invalid_argument("HKDF-Expand: " + std::to_string(length) +
                                " bytes asked; 1 to 8160 can be derived");
  return run_hkdf(EVP_KDF_HKDF_MODE_EXPAND_ONLY, prk, {}, info, length);
}

std::string hkdf(std::string_view salt, std::string_view ikm, std::string_view info,
                 std::size_t length) {
  std::string prk = hkdf_extract(salt, ikm);
  std::string out = hkdf_expand(prk, info, length);
  cleanse(prk);
  return out;
}

std::string hkdf_expand_label(std::string_view secret, std::string_view label,
                              std::string_view context, std::size_t length) {
  // struct { uint16 length; opaque label<7..255>; opaque context<0..255>; }
  const std::size_t label_size = 6 + label.size();
  if (length > 0xffff || label_size > 255 || context.size() > 255)
    throw std::invalid_argument("HKDF-Expand-Label: a length, label or context too long");
  std::string info;
  info.push_back(static_cast<char>(length >> 8));
  info.push_back(static_cast<char>(length & 0xff));
  info.push_back(static_cast<char>(label_size));
  info += "tls13 ";
  info += label;
  info.push_back(static_cast<char>(context.size()));
  info += context;
  return hkdf_expand(secret, info, length);
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {  // RAND_bytes takes an int
    const int piece = static_cast<int>(std::min<std::size_t>(n, INT_MAX));
    if (RAND_bytes(p, piece) != 1) fail("the random generator");
    p += piece;
    n -= static_cast<std::size_t>(piece);
  }
}

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  random_bytes(out.data(), n);
  return out;
}

void cleanse(void* p, std::size_t n) {
  if (p && n > 0) OPENSSL_cleanse(p, n);
}

void cleanse(std::string& s) {
  cleanse(s.data(), s.size());
  s.clear();
}

std::string to_hex(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::string to_hex(const sha256_digest& d) {
  return to_hex(as_string(d));
}

std::string as_string(const sha256_digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

}  // namespace troupe::crypto
