#include "net/tls_records.hpp"

#include "net/fork_join_pool.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "crypto/crypto.hpp"

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

// iv XOR the 64-bit big-endian sequence number, left-padded to 12 bytes.
void make_nonce(const std::array<unsigned char, 12>& iv, uint64_t seq, unsigned char* nonce) {
  std::memcpy(nonce, iv.data(), 12);
  for (int i = 0; i < 8; ++i) nonce[11 - i] ^= static_cast<unsigned char>(seq >> (8 * i));
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
  std::string key = crypto::hkdf_expand_label(secret, "key", "", k.key.size());
  std::string iv = crypto::hkdf_expand_label(secret, "iv", "", k.iv.size());
  std::memcpy(k.key.data(), key.data(), k.key.size());
  std::memcpy(k.iv.data(), iv.data(), k.iv.size());
  crypto::cleanse(key);
  crypto::cleanse(iv);
  return k;
}

// ---------------------------------------------------------------- keys

traffic_contexts::traffic_contexts(const std::string& secret, bool encrypt, unsigned lanes)
    : secret_(secret), encrypt_(encrypt) {
  try {
    for (unsigned lane = 0; lane < lanes; ++lane) {
      ctx_.push_back(EVP_CIPHER_CTX_new());
      if (!ctx_.back())
        throw std::runtime_error("TLS 1.3 records: cannot allocate a cipher context");
    }
    key_contexts();
  } catch (...) {
    release();  // (no destructor runs for a constructor that throws)
    throw;
  }
}

traffic_contexts::~traffic_contexts() {
  release();
}

void traffic_contexts::release() {
  for (auto* ctx : ctx_) EVP_CIPHER_CTX_free(ctx);  // (null is fine; it wipes the key schedule)
  ctx_.clear();
  crypto::cleanse(secret_);
  OPENSSL_cleanse(iv_.data(), iv_.size());
}

void traffic_contexts::key_contexts() {
  traffic_keys k = derive_traffic_keys(secret_);
  iv_ = k.iv;
  bool ok = true;
  for (auto* ctx : ctx_)
    ok = ok && EVP_CipherInit_ex(ctx, EVP_aes_128_gcm(), nullptr, k.key.data(), nullptr,
                                 encrypt_ ? 1 : 0) == 1;
  OPENSSL_cleanse(k.key.data(), k.key.size());
  OPENSSL_cleanse(k.iv.data(), k.iv.size());
  if (!ok) throw std::runtime_error("TLS 1.3 records: cannot set up AES-128-GCM");
}

void traffic_contexts::update() {
  std::string next = crypto::hkdf_expand_label(secret_, "traffic upd", "", 32);
  crypto::cleanse(secret_);
  secret_ = std::move(next);
  key_contexts();
}

// ---------------------------------------------------------------- writer

namespace {
constexpr const char* kSealFailed = "TLS 1.3 records: AES-128-GCM sealing failed";
constexpr const char* kWriterFailed =
    "TLS 1.3 records: this writer failed before (a sequence number may have been used; the "
    "link must close)";
}  // namespace

record_writer::record_writer(const std::string& traffic_secret, fork_join_pool* pool,
                             uint64_t records_per_key)
    : keys_(traffic_secret, true, pool ? pool->lanes() : 1),
      pool_(pool),
      records_per_key_(records_per_key) {
  if (records_per_key < 2)
    throw std::invalid_argument("TLS 1.3 records: at least 2 records per key (data and update)");
}

record_writer::~record_writer() = default;

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
  make_nonce(keys_.iv(), seq, nonce);
  unsigned char* c = h + header_size;
  EVP_CIPHER_CTX* ctx = keys_[lane];
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

std::size_t record_writer::max_sealed_size(std::size_t n) const {
  const std::size_t records = (n + max_plaintext - 1) / max_plaintext;
  // One update may come first; then one after every records_per_key - 1.
  return sealed_size(n) + (1 + records / (records_per_key_ - 1)) * key_update_size;
}

std::size_t record_writer::seal_key_update(char* dst) {
  const unsigned char key_update[5] = {24, 0, 0, 1, 0};  // KeyUpdate, update_not_requested
  if (!seal_record(0, seq_, key_update, sizeof key_update, type_handshake, dst))
    throw std::runtime_error(kSealFailed);
  ++records_;
  keys_.update();
  seq_ = 0;
  ++key_updates_;
  update_due_ = false;
  return key_update_size;
}

std::size_t record_writer::seal_to(const char* data, std::size_t n, char* dst) {
  return seal_to(data, n, dst, {});
}

std::size_t record_writer::seal_to(const char* data, std::size_t n, char* dst,
                                   const std::function<void(std::size_t)>& sealed) {
  if (failed_) throw std::runtime_error(kWriterFailed);
  const auto* src = reinterpret_cast<const unsigned char*>(data);
  std::size_t at = 0;  // bytes of dst sealed
  try {
    for (std::size_t done = 0; done < n;) {
      if (key_update_due()) at += seal_key_update(dst + at);
      // As many records as the current key has room for, its update aside.
      const uint64_t records_left = (n - done + max_plaintext - 1) / max_plaintext;
      const uint64_t records = std::min(records_left, records_per_key_ - 1 - seq_);
      const std::size_t take =
          static_cast<std::size_t>(std::min<uint64_t>(n - done, records * uint64_t{max_plaintext}));
      at += seal_run(src + done, take, dst + at, at, sealed);
      done += take;
    }
  } catch (...) {
    failed_ = true;  // whatever failed, no record is ever sealed again
    throw;
  }
  return at;
}

std::size_t record_writer::seal_run(const unsigned char* src, std::size_t n, char* dst,
                                    std::size_t base,
                                    const std::function<void(std::size_t)>& sealed) {
  const std::size_t records = (n + max_plaintext - 1) / max_plaintext;
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
    if (sealed) sealed(base + std::min(total, k * (max_plaintext + record_overhead)));
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
  if (first_failed.load() < records) throw std::runtime_error(kSealFailed);
  seq_ += records;
  records_ += records;
  return total;
}

void record_writer::seal(const char* data, std::size_t n, std::vector<char>& out) {
  if (n == 0) return;
  const std::size_t old = out.size();
  out.resize(old + max_sealed_size(n));
  try {
    out.resize(old + seal_to(data, n, out.data() + old));
  } catch (...) {
    out.resize(old);
    throw;
  }
}

void record_writer::seal_alert_record(unsigned char level, unsigned char description,
                                      std::vector<char>& out) {
  if (failed_) throw std::runtime_error(kWriterFailed);
  const unsigned char alert[2] = {level, description};
  const std::size_t old = out.size();
  out.resize(old + key_update_size + sizeof alert + record_overhead);
  try {
    std::size_t at = old;
    if (key_update_due()) at += seal_key_update(out.data() + at);
    if (!seal_record(0, seq_, alert, sizeof alert, type_alert, out.data() + at))
      throw std::runtime_error(kSealFailed);
    ++seq_;
    ++records_;
    out.resize(at + sizeof alert + record_overhead);
  } catch (...) {
    failed_ = true;
    out.resize(old);
    throw;
  }
}

void record_writer::seal_close_notify(std::vector<char>& out) {
  seal_alert_record(1, 0, out);  // warning, close_notify
}

void record_writer::seal_alert(unsigned char description, std::vector<char>& out) {
  seal_alert_record(2, description, out);  // fatal
}

// ---------------------------------------------------------------- reader

record_reader::record_reader(const std::string& traffic_secret, fork_join_pool* pool)
    : keys_(traffic_secret, false, pool ? pool->lanes() : 1), pool_(pool) {}

std::string record_reader::refuse(unsigned char description, std::string why) {
  alert_ = description;
  return why;
}

std::string record_reader::check_header(const unsigned char* h, std::size_t* body) {
  const std::size_t len = (std::size_t{h[3]} << 8) | h[4];
  *body = len;
  if (h[0] == type_ccs)  // RFC 8446 5: only before the peer's Finished, which came before
    return refuse(alert::unexpected_message,
                  "a change_cipher_spec record after the handshake (TLS 1.3 allows one only "
                  "before the peer's Finished)");
  if (h[0] != type_app_data || h[1] != 0x03 || h[2] != 0x03) {
    static const char hex[] = "0123456789abcdef";
    std::string bytes;
    for (int i = 0; i < 3; ++i) {
      bytes += hex[h[i] >> 4];
      bytes += hex[h[i] & 15];
      if (i < 2) bytes += ' ';
    }
    return refuse(alert::unexpected_message, "not a TLS 1.3 application data record: header " +
                                                 bytes + " (expected type 23 with version 03 03)");
  }
  if (len > max_ciphertext)
    return refuse(alert::record_overflow, "a record of " + std::to_string(len) +
                                              " bytes, over TLS's limit (" +
                                              std::to_string(max_ciphertext) + ")");
  if (len < 1 + tag_size)
    return refuse(alert::decode_error,
                  "a record of " + std::to_string(len) +
                      " bytes, too short for TLS 1.3 (at least 17: a content type and the "
                      "16-byte tag)");
  return "";
}

bool record_reader::decrypt_record(unsigned lane, uint64_t seq, const unsigned char* rec,
                                   std::size_t body, unsigned char* out) {
  const unsigned char* b = rec + header_size;
  const std::size_t clen = body - tag_size;
  unsigned char nonce[12];
  make_nonce(keys_.iv(), seq, nonce);
  unsigned char tag[tag_size];
  std::memcpy(tag, b + clen, tag_size);
  EVP_CIPHER_CTX* ctx = keys_[lane];
  int len = 0;
  return EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, nonce, 0) == 1 &&
         EVP_DecryptUpdate(ctx, nullptr, &len, rec, static_cast<int>(header_size)) == 1 &&
         EVP_DecryptUpdate(ctx, out, &len, b, static_cast<int>(clen)) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag_size), tag) == 1 &&
         EVP_DecryptFinal_ex(ctx, out + clen, &len) == 1;
}

namespace {
std::string bad_mac(uint64_t record, std::size_t body) {
  return "cannot decrypt " + record_number(record) + " of " + std::to_string(body) +
         " bytes: bad record mac (the record was altered, replayed, reordered or sealed "
         "with another key)";
}
}  // namespace

std::string record_reader::open_record(const unsigned char* rec, std::size_t body, char* out,
                                       std::size_t* produced) {
  *produced = 0;
  if (seq_ == std::numeric_limits<uint64_t>::max())
    return refuse(alert::internal_error, "the sequence numbers of this key are used up");
  auto* dst = reinterpret_cast<unsigned char*>(out);
  if (!decrypt_record(0, seq_, rec, body, dst))
    return refuse(alert::bad_record_mac, bad_mac(records_, body));
  return finish_record(dst, body - tag_size, produced);
}

std::string record_reader::finish_record(unsigned char* dst, std::size_t clen,
                                         std::size_t* produced) {
  *produced = 0;
  const uint64_t number = records_;
  if (clen > max_plaintext + 1)
    return refuse(alert::record_overflow,
                  record_number(number) + " holds " + std::to_string(clen) +
                      " bytes of plaintext, over TLS's limit (record_overflow)");
  // Strip the zero padding: the content type is the last non-zero byte.
  std::size_t i = clen;
  while (i > 0 && dst[i - 1] == 0) --i;
  if (i == 0)
    return refuse(alert::unexpected_message,
                  record_number(number) + " has no content type (its plaintext is all zeros)");
  const unsigned char type = dst[i - 1];
  const std::size_t content = i - 1;
  ++seq_;
  ++records_;
  if (type == type_app_data) {
    *produced = content;
    return "";
  }
  if (type == type_alert) return read_alert(dst, content);
  if (type == type_handshake) return read_key_update(dst, content);
  return refuse(
      alert::unexpected_message,
      record_number(number) + " has the unknown inner content type " + std::to_string(type));
}

std::string record_reader::read_alert(const unsigned char* a, std::size_t n) {
  if (n != 2)
    return refuse(alert::decode_error,
                  "a malformed TLS alert (" + std::to_string(n) + " bytes, expected 2)");
  if (a[1] == 0 && (a[0] == 1 || a[0] == 2)) {
    closed_ = true;
    return "";
  }
  if (a[1] == 0)
    return refuse(alert::illegal_parameter,
                  "a close_notify alert with level " + std::to_string(a[0]) + " (expected 1 or 2)");
  alert_.reset();  // the peer ended it: nothing is owed
  return "the peer sent TLS alert " + std::to_string(a[1]) + " (" + alert_name(a[1]) + ")";
}

std::string record_reader::read_key_update(const unsigned char* m, std::size_t n) {
  constexpr unsigned char key_update = 24;
  if (n == 0 || m[0] != key_update)
    return refuse(alert::unexpected_message,
                  "the peer sent a post-handshake message (type " +
                      (n > 0 ? std::to_string(m[0]) : std::string("none: an empty record")) +
                      "), which these links do not take");
  // Exactly one KeyUpdate, alone in its record (RFC 8446 5.1: a message that
  // changes keys ends its record): type, 24-bit length 1, request_update.
  if (n != 5 || m[1] != 0 || m[2] != 0 || m[3] != 1 || m[4] > 1)
    return refuse(alert::decode_error,
                  "a malformed KeyUpdate (" + std::to_string(n) +
                      " bytes; expected the 5 of one message with request_update 0 or 1, alone "
                      "in its record)");
  keys_.update();
  seq_ = 0;
  ++key_updates_;
  rekeyed_ = true;
  update_requested_ |= m[4] == 1;
  return "";
}

std::string record_reader::open_run(const unsigned char*& p, std::size_t& left, char*& out,
                                    std::size_t* produced) {
  run_.clear();
  std::size_t off = 0, at = 0, body = 0;
  // Only whole application-data records with good headers: anything else
  // (a bad header, a partial record) is left to the one-by-one path.
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
  // follows a close_notify is ignored, and what follows a KeyUpdate is
  // opened again under the new keys.
  std::size_t written = 0;
  std::string why;
  rekeyed_ = false;
  for (const auto& r : run_) {
    std::size_t got = 0;
    why = r.authentic ? finish_record(base + r.at, r.body - tag_size, &got)
                      : refuse(alert::bad_record_mac, bad_mac(records_, r.body));
    if (got > 0 && r.at != written) std::memmove(base + written, base + r.at, got);
    written += got;
    p += header_size + r.body;
    left -= header_size + r.body;
    if (!why.empty() || closed_ || rekeyed_) break;
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
