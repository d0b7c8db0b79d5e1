#include "runtime/tls_records.hpp"

#include "runtime/fork_join_pool.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace troupe::tls13 {

namespace {

constexpr unsigned char type_ccs = 20;
constexpr unsigned char type_alert = 21;
constexpr unsigned char type_handshake = 22;
constexpr unsigned char type_app_data = 23;
// Per record on the wire beyond the content: header, inner type, tag.
constexpr std::size_t record_overhead = header_size + 1 + tag_size;

// HKDF-Expand (RFC 5869) over SHA-256.
void hkdf_expand(const std::string& prk, const std::string& info, unsigned char* out,
                 std::size_t len) {
  unsigned char t[32];
  std::size_t t_len = 0;
  std::string block;
  for (unsigned char i = 1; len > 0; ++i) {
    block.assign(reinterpret_cast<const char*>(t), t_len);
    block += info;
    block.push_back(static_cast<char>(i));
    unsigned int md_len = 0;
    if (!HMAC(EVP_sha256(), prk.data(), static_cast<int>(prk.size()),
              reinterpret_cast<const unsigned char*>(block.data()), block.size(), t, &md_len) ||
        md_len != sizeof t)
      throw std::runtime_error("TLS 1.3 traffic keys: HMAC-SHA256 failed");
    t_len = md_len;
    std::size_t take = std::min(len, t_len);
    std::memcpy(out, t, take);
    out += take;
    len -= take;
  }
  OPENSSL_cleanse(t, sizeof t);
  OPENSSL_cleanse(block.data(), block.size());
}

// HKDF-Expand-Label(secret, label, "", len) of RFC 8446 section 7.1.
void expand_label(const std::string& secret, const std::string& label, unsigned char* out,
                  std::size_t len) {
  std::string full = "tls13 " + label;
  std::string info;
  info.push_back(static_cast<char>(len >> 8));
  info.push_back(static_cast<char>(len & 0xff));
  info.push_back(static_cast<char>(full.size()));
  info += full;
  info.push_back(0);  // empty context
  hkdf_expand(secret, info, out, len);
}

// iv XOR the 64-bit big-endian sequence number, left-padded to 12 bytes.
void make_nonce(const std::array<unsigned char, 12>& iv, uint64_t seq, unsigned char* nonce) {
  std::memcpy(nonce, iv.data(), 12);
  for (int i = 0; i < 8; ++i) nonce[11 - i] ^= static_cast<unsigned char>(seq >> (8 * i));
}

// One AES-128-GCM context per lane, all keyed from `secret`.
std::vector<EVP_CIPHER_CTX*> make_contexts(const std::string& secret, int enc,
                                           std::array<unsigned char, 12>& iv,
                                           const fork_join_pool* pool) {
  traffic_keys k = derive_traffic_keys(secret);
  iv = k.iv;
  std::vector<EVP_CIPHER_CTX*> contexts;
  const unsigned lanes = pool ? pool->lanes() : 1;
  bool ok = true;
  for (unsigned lane = 0; ok && lane < lanes; ++lane) {
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    if (ctx) contexts.push_back(ctx);
    ok = ctx && EVP_CipherInit_ex(ctx, EVP_aes_128_gcm(), nullptr, k.key.data(), nullptr, enc);
  }
  OPENSSL_cleanse(k.key.data(), k.key.size());
  if (!ok) {
    for (auto* ctx : contexts) EVP_CIPHER_CTX_free(ctx);
    throw std::runtime_error("TLS 1.3 records: cannot set up AES-128-GCM");
  }
  return contexts;
}

void free_contexts(std::vector<EVP_CIPHER_CTX*>& contexts) {
  for (auto* ctx : contexts) EVP_CIPHER_CTX_free(ctx);
  contexts.clear();
}

const char* alert_name(unsigned char desc) {
  switch (desc) {
    case 0:
      return "close_notify";
    case 10:
      return "unexpected_message";
    case 20:
      return "bad_record_mac";
    case 22:
      return "record_overflow";
    case 40:
      return "handshake_failure";
    case 42:
      return "bad_certificate";
    case 43:
      return "unsupported_certificate";
    case 44:
      return "certificate_revoked";
    case 45:
      return "certificate_expired";
    case 46:
      return "certificate_unknown";
    case 47:
      return "illegal_parameter";
    case 48:
      return "unknown_ca";
    case 49:
      return "access_denied";
    case 50:
      return "decode_error";
    case 51:
      return "decrypt_error";
    case 70:
      return "protocol_version";
    case 71:
      return "insufficient_security";
    case 80:
      return "internal_error";
    case 86:
      return "inappropriate_fallback";
    case 90:
      return "user_canceled";
    case 109:
      return "missing_extension";
    case 110:
      return "unsupported_extension";
    case 112:
      return "unrecognized_name";
    case 113:
      return "bad_certificate_status_response";
    case 115:
      return "unknown_psk_identity";
    case 116:
      return "certificate_required";
    case 120:
      return "no_application_protocol";
    default:
      return "an alert this reader has no name for";
  }
}

std::string record_number(uint64_t seq) {
  return "record " + std::to_string(seq);
}

}  // namespace

traffic_keys derive_traffic_keys(const std::string& secret) {
  if (secret.size() != 32)
    throw std::runtime_error("a TLS_AES_128_GCM_SHA256 traffic secret is 32 bytes, got " +
                             std::to_string(secret.size()));
  traffic_keys k;
  expand_label(secret, "key", k.key.data(), k.key.size());
  expand_label(secret, "iv", k.iv.data(), k.iv.size());
  return k;
}

// ---------------------------------------------------------------- writer

// (iv_ is a member declared after ctx_: set in the body, not the initializer list.)
record_writer::record_writer(const std::string& traffic_secret, fork_join_pool* pool)
    : pool_(pool) {
  ctx_ = make_contexts(traffic_secret, 1, iv_, pool);
}

record_writer::~record_writer() {
  free_contexts(ctx_);
  OPENSSL_cleanse(iv_.data(), iv_.size());
}

bool record_writer::seal_record(unsigned lane, uint64_t seq, const unsigned char* data,
                                std::size_t n, unsigned char type, char* dst) {
  auto* h = reinterpret_cast<unsigned char*>(dst);
  const std::size_t body = n + 1 + tag_size;
  h[0] = type_app_data;
  h[1] = 0x03;
  h[2] = 0x03;
  h[3] = static_cast<unsigned char>(body >> 8);
  h[4] = static_cast<unsigned char>(body & 0xff);
  unsigned char nonce[12];
  make_nonce(iv_, seq, nonce);
  unsigned char* c = h + header_size;
  EVP_CIPHER_CTX* ctx = ctx_[lane];
  int len = 0;
  return EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, nonce, 1) == 1 &&
         EVP_EncryptUpdate(ctx, nullptr, &len, h, static_cast<int>(header_size)) == 1 &&
         (n == 0 || EVP_EncryptUpdate(ctx, c, &len, data, static_cast<int>(n)) == 1) &&
         EVP_EncryptUpdate(ctx, c + n, &len, &type, 1) == 1 &&
         EVP_EncryptFinal_ex(ctx, c + n + 1, &len) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag_size), c + n + 1) == 1;
}

std::size_t record_writer::sealed_size(std::size_t n) {
  return n + (n + max_plaintext - 1) / max_plaintext * record_overhead;
}

std::size_t record_writer::seal_to(const char* data, std::size_t n, char* dst) {
  return seal_to(data, n, dst, {});
}

std::size_t record_writer::seal_to(const char* data, std::size_t n, char* dst,
                                   const std::function<void(std::size_t)>& sealed) {
  const std::size_t records = (n + max_plaintext - 1) / max_plaintext;
  if (records > std::numeric_limits<uint64_t>::max() - seq_)
    throw std::runtime_error("TLS 1.3 records: the sequence numbers of this key are used up");
  const auto* src = reinterpret_cast<const unsigned char*>(data);
  const std::size_t total = sealed_size(n);
  std::atomic<std::size_t> first_failed{records};
  auto seal_one = [&](std::size_t i, unsigned lane) {
    const std::size_t off = i * max_plaintext;
    if (!seal_record(lane, seq_ + i, src + off, std::min(max_plaintext, n - off), type_app_data,
                     dst + i * (max_plaintext + record_overhead))) {
      std::size_t was = first_failed.load();
      while (i < was && !first_failed.compare_exchange_weak(was, i)) {
      }
    }
  };
  // Hands on whole records only, and none from the first failed one on.
  auto hand_on = [&](std::size_t k) {
    k = std::min(k, first_failed.load());
    if (sealed) sealed(std::min(total, k * (max_plaintext + record_overhead)));
  };
  if (pool_ && records >= min_parallel_records) {
    if (sealed)
      pool_->run(records, seal_one, hand_on, min_parallel_records);
    else
      pool_->run(records, seal_one);
  } else {
    for (std::size_t i = 0; i < records; ++i) seal_one(i, 0);
    hand_on(records);
  }
  if (first_failed.load() < records)
    throw std::runtime_error("TLS 1.3 records: AES-128-GCM sealing failed");
  seq_ += records;
  return total;
}

void record_writer::seal(const char* data, std::size_t n, std::vector<char>& out) {
  if (n == 0) return;
  const std::size_t old = out.size();
  out.resize(old + sealed_size(n));
  try {
    seal_to(data, n, out.data() + old);
  } catch (...) {
    out.resize(old);
    throw;
  }
}

void record_writer::seal_close_notify(std::vector<char>& out) {
  const unsigned char alert[2] = {1, 0};  // warning, close_notify
  if (seq_ == std::numeric_limits<uint64_t>::max())
    throw std::runtime_error("TLS 1.3 records: the sequence numbers of this key are used up");
  const std::size_t old = out.size();
  out.resize(old + sizeof alert + record_overhead);
  if (!seal_record(0, seq_, alert, sizeof alert, type_alert, out.data() + old)) {
    out.resize(old);
    throw std::runtime_error("TLS 1.3 records: AES-128-GCM sealing failed");
  }
  ++seq_;
}

// ---------------------------------------------------------------- reader

// (iv_ is a member declared after ctx_: set in the body, not the initializer list.)
record_reader::record_reader(const std::string& traffic_secret, fork_join_pool* pool)
    : pool_(pool) {
  ctx_ = make_contexts(traffic_secret, 0, iv_, pool);
}

record_reader::~record_reader() {
  free_contexts(ctx_);
  OPENSSL_cleanse(iv_.data(), iv_.size());
}

std::string record_reader::check_header(const unsigned char* h, std::size_t* body) {
  const std::size_t len = (std::size_t{h[3]} << 8) | h[4];
  *body = len;
  if ((h[0] != type_app_data && h[0] != type_ccs) || h[1] != 0x03 || h[2] != 0x03) {
    static const char hex[] = "0123456789abcdef";
    std::string bytes;
    for (int i = 0; i < 3; ++i) {
      bytes += hex[h[i] >> 4];
      bytes += hex[h[i] & 15];
      if (i < 2) bytes += ' ';
    }
    return "not a TLS 1.3 application data record: header " + bytes +
           " (expected type 23 with version 03 03)";
  }
  if (len > max_ciphertext)
    return "a record of " + std::to_string(len) + " bytes, over TLS's limit (" +
           std::to_string(max_ciphertext) + ")";
  if (h[0] == type_ccs) {
    if (len != 1)
      return "a change_cipher_spec record of " + std::to_string(len) + " bytes (expected 1)";
  } else if (len < 1 + tag_size) {
    return "a record of " + std::to_string(len) +
           " bytes, too short for TLS 1.3 (at least 17: a content type and the 16-byte tag)";
  }
  return "";
}

bool record_reader::decrypt_record(unsigned lane, uint64_t seq, const unsigned char* rec,
                                   std::size_t body, unsigned char* out) {
  const unsigned char* b = rec + header_size;
  const std::size_t clen = body - tag_size;
  unsigned char nonce[12];
  make_nonce(iv_, seq, nonce);
  unsigned char tag[tag_size];
  std::memcpy(tag, b + clen, tag_size);
  EVP_CIPHER_CTX* ctx = ctx_[lane];
  int len = 0;
  return EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, nonce, 0) == 1 &&
         EVP_DecryptUpdate(ctx, nullptr, &len, rec, static_cast<int>(header_size)) == 1 &&
         EVP_DecryptUpdate(ctx, out, &len, b, static_cast<int>(clen)) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag_size), tag) == 1 &&
         EVP_DecryptFinal_ex(ctx, out + clen, &len) == 1;
}

namespace {
std::string bad_mac(uint64_t seq, std::size_t body) {
  return "cannot decrypt " + record_number(seq) + " of " + std::to_string(body) +
         " bytes: bad record mac (the record was altered, replayed, reordered or sealed "
         "with another key)";
}
}  // namespace

std::string record_reader::open_record(const unsigned char* rec, std::size_t body, char* out,
                                       std::size_t* produced) {
  *produced = 0;
  const unsigned char* b = rec + header_size;
  if (rec[0] == type_ccs) {
    if (b[0] != 0x01)
      return "a change_cipher_spec record holding " + std::to_string(b[0]) + " (expected 1)";
    if (seen_ccs_) return "a second change_cipher_spec record (only one may come, before the data)";
    seen_ccs_ = true;
    return "";
  }
  if (seq_ == std::numeric_limits<uint64_t>::max())
    return "the sequence numbers of this key are used up";
  auto* dst = reinterpret_cast<unsigned char*>(out);
  if (!decrypt_record(0, seq_, rec, body, dst)) return bad_mac(seq_, body);
  return finish_record(dst, body - tag_size, produced);
}

std::string record_reader::finish_record(unsigned char* dst, std::size_t clen,
                                         std::size_t* produced) {
  *produced = 0;
  if (clen > max_plaintext + 1) {
    return record_number(seq_) + " holds " + std::to_string(clen) +
           " bytes of plaintext, over TLS's limit (record_overflow)";
  }
  // Strip the zero padding: the content type is the last non-zero byte.
  std::size_t i = clen;
  while (i > 0 && dst[i - 1] == 0) --i;
  if (i == 0) {
    return record_number(seq_) + " has no content type (its plaintext is all zeros)";
  }
  const unsigned char type = dst[i - 1];
  const std::size_t content = i - 1;
  if (type == type_app_data) {
    *produced = content;
    ++seq_;
    return "";
  }
  std::string why;
  if (type == type_alert) {
    if (content != 2) {
      why = "a malformed TLS alert (" + std::to_string(content) + " bytes, expected 2)";
    } else if (dst[1] == 0 && (dst[0] == 1 || dst[0] == 2)) {
      closed_ = true;
    } else if (dst[1] == 0) {
      why = "a close_notify alert with level " + std::to_string(dst[0]) + " (expected 1 or 2)";
    } else {
      why = "the peer sent TLS alert " + std::to_string(dst[1]) + " (" + alert_name(dst[1]) + ")";
    }
  } else if (type == type_handshake) {
    why = "the peer sent a post-handshake message (type " +
          (content > 0 ? std::to_string(dst[0]) : std::string("none: an empty record")) +
          "), which these links do not take";
  } else {
    why = record_number(seq_) + " has the unknown inner content type " + std::to_string(type);
  }
  ++seq_;
  return why;
}

std::string record_reader::open_run(const unsigned char*& p, std::size_t& left, char*& out,
                                    std::size_t* produced) {
  run_.clear();
  std::size_t off = 0, at = 0, body = 0;
  // Only whole application-data records with good headers: anything else
  // (CCS, a bad header, a partial record) is left to the one-by-one path.
  while (left - off >= header_size && p[off] == type_app_data &&
         check_header(p + off, &body).empty() && left - off >= header_size + body) {
    run_.push_back({p + off, body, at, false});
    at += body - tag_size;
    off += header_size + body;
  }
  if (run_.size() < min_parallel_records ||
      run_.size() > std::numeric_limits<uint64_t>::max() - seq_)
    return "";
  auto* base = reinterpret_cast<unsigned char*>(out);
  pool_->run(run_.size(), [&](std::size_t i, unsigned lane) {
    auto& r = run_[i];
    r.authentic = decrypt_record(lane, seq_ + i, r.rec, r.body, base + r.at);
  });
  // In order, as one by one: what precedes a bad record is delivered, what
  // follows a close_notify is ignored.
  std::size_t written = 0;
  std::string why;
  for (const auto& r : run_) {
    std::size_t got = 0;
    why = r.authentic ? finish_record(base + r.at, r.body - tag_size, &got) : bad_mac(seq_, r.body);
    if (got > 0 && r.at != written) std::memmove(base + written, base + r.at, got);
    written += got;
    p += header_size + r.body;
    left -= header_size + r.body;
    if (!why.empty() || closed_) break;
  }
  out += written;
  *produced += written;
  return why;
}

std::string record_reader::feed(const char* data, std::size_t n, std::vector<char>& out) {
  const std::size_t old = out.size();
  out.resize(old + max_output(n));
  std::size_t produced = 0;
  auto why = feed_to(data, n, out.data() + old, &produced);
  out.resize(old + produced);
  return why;
}

std::size_t record_reader::max_output(std::size_t n) const {
  return pending_.size() + n;  // a record's plaintext is shorter than the record
}

std::string record_reader::feed_to(const char* data, std::size_t n, char* out,
                                   std::size_t* produced) {
  *produced = 0;
  if (!error_.empty()) return error_;
  if (closed_) return "";
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  std::size_t left = n;
  auto fail = [&](std::string why) {
    error_ = std::move(why);
    pending_.clear();
    return error_;
  };
  std::size_t body = 0;
  if (!pending_.empty()) {  // finish the record an earlier call began
    if (pending_.size() < header_size) {
      std::size_t take = std::min(header_size - pending_.size(), left);
      pending_.insert(pending_.end(), p, p + take);
      p += take;
      left -= take;
      if (pending_.size() < header_size) return "";
    }
    if (auto why = check_header(pending_.data(), &body); !why.empty()) return fail(why);
    std::size_t take = std::min(header_size + body - pending_.size(), left);
    pending_.insert(pending_.end(), p, p + take);
    p += take;
    left -= take;
    if (pending_.size() < header_size + body) return "";
    std::size_t got = 0;
    if (auto why = open_record(pending_.data(), body, out, &got); !why.empty()) return fail(why);
    out += got;
    *produced += got;
    pending_.clear();
    if (closed_) return "";
  }
  while (left >= header_size) {  // whole records straight from the caller's bytes
    if (pool_) {
      if (auto why = open_run(p, left, out, produced); !why.empty()) return fail(why);
      if (closed_) return "";
      if (left < header_size) break;
    }
    if (auto why = check_header(p, &body); !why.empty()) return fail(why);
    if (left < header_size + body) break;
    std::size_t got = 0;
    if (auto why = open_record(p, body, out, &got); !why.empty()) return fail(why);
    out += got;
    *produced += got;
    p += header_size + body;
    left -= header_size + body;
    if (closed_) return "";
  }
  pending_.assign(p, p + left);
  return "";
}

}  // namespace troupe::tls13
