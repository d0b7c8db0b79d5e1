#pragma once
// TLS 1.3 record protection (RFC 8446 section 5.2) with the traffic keys of
// section 7.1/7.3, for TLS_AES_128_GCM_SHA256 only. After OpenSSL ran the
// handshake, each direction of a link protects its application records
// itself, one thread per direction, from that direction's application
// traffic secret (what kernel TLS does). The wire stays genuine TLS 1.3
// records: a peer that keeps using SSL_read/SSL_write interoperates.
//
// Each object is used by one thread only; given a fork_join_pool, a chunk
// of several records is sealed or opened on the pool's lanes side by side
// (records are independent once their sequence numbers are fixed), and the
// result is the same bytes and the same errors as one by one.
//
// Threat model: the peer, or anyone on the path, may send any bytes. The
// reader refuses (and stays failed on) anything but authentic records in
// order: a flipped bit, a replay, a reorder, a record of another key, a
// change_cipher_spec after the handshake, a post-handshake message other
// than KeyUpdate; each error names the alert this end owes the peer.
// The writer never reuses a nonce: a seal that fails (OpenSSL, or the
// caller's hand-on callback throwing) leaves it failed for good, so a link
// that goes on after a failure cannot seal two messages under one sequence
// number.
//
// Key updates (RFC 8446 4.6.3, 7.2): AES-GCM allows about 2^24.5 full-size
// records under one key (5.5). Each direction rekeys itself long before,
// every records_per_key records: a KeyUpdate record, then the next traffic
// secret. In-band rekeying costs one HKDF and new cipher keys: 5-13 us a
// KeyUpdate against 1.3-3.1 ms for a TLS 1.3 handshake alone, in memory
// (bench/README.md, 2026-11-28); closing and reopening a link would add the
// network's round trips, the gate's exchange and BASP's own handshake, and
// drop the messages in flight. A peer's KeyUpdate is followed; one with
// update_requested makes take_key_update_request() true once, and the
// link's writer then updates its own keys before its next record
// (request_key_update). No other post-handshake message is taken (OpenSSL
// sends none unprompted with num_tickets 0).
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;  // as OpenSSL's <openssl/types.h>

namespace troupe {
class fork_join_pool;
}

namespace troupe::tls13 {

// The record limits of RFC 8446 section 5.1/5.2.
inline constexpr std::size_t max_plaintext = 16384;
inline constexpr std::size_t max_ciphertext = max_plaintext + 256;
inline constexpr std::size_t header_size = 5;
inline constexpr std::size_t tag_size = 16;
// Fewer records than this in one call are handled on the caller's thread
// alone: a helper's hand-over costs about what a record's crypto does.
inline constexpr std::size_t min_parallel_records = 4;
// Records under one traffic key, its KeyUpdate included: 2^20 (16 GiB of
// full records), a 2^4.5-fold margin under AES-GCM's limit.
inline constexpr uint64_t default_records_per_key = uint64_t{1} << 20;
// A sealed KeyUpdate: header, the 5-byte message, inner type, tag.
inline constexpr std::size_t key_update_size = header_size + 5 + 1 + tag_size;

// Alert descriptions (RFC 8446 6) this layer sends.
namespace alert {
inline constexpr unsigned char unexpected_message = 10;
inline constexpr unsigned char bad_record_mac = 20;
inline constexpr unsigned char record_overflow = 22;
inline constexpr unsigned char illegal_parameter = 47;
inline constexpr unsigned char decode_error = 50;
inline constexpr unsigned char internal_error = 80;
}  // namespace alert

struct traffic_keys {
  std::array<unsigned char, 16> key{};
  std::array<unsigned char, 12> iv{};
};

// key = HKDF-Expand-Label(secret, "key", "", 16), iv = ...("iv", "", 12),
// over SHA-256. `secret` must be 32 bytes; throws std::runtime_error.
traffic_keys derive_traffic_keys(const std::string& secret);

// One direction's AES-128-GCM contexts (one per lane), its iv, and the
// traffic secret they were keyed from, which a KeyUpdate advances. The
// secret and the keys are wiped when replaced and on destruction.
class traffic_contexts {
 public:
  traffic_contexts(const std::string& secret, bool encrypt, unsigned lanes);
  ~traffic_contexts();
  traffic_contexts(const traffic_contexts&) = delete;
  traffic_contexts& operator=(const traffic_contexts&) = delete;
  // secret = HKDF-Expand-Label(secret, "traffic upd", "", 32), and every
  // context keyed anew from it.
  void update();
  EVP_CIPHER_CTX* operator[](unsigned lane) const { return ctx_[lane]; }
  const std::array<unsigned char, 12>& iv() const { return iv_; }

 private:
  void key_contexts();
  void release();
  std::vector<EVP_CIPHER_CTX*> ctx_;
  std::string secret_;
  std::array<unsigned char, 12> iv_{};
  bool encrypt_;
};

// traffic_secret: the 32-byte application traffic secret of one direction
// (client_application_traffic_secret_0 or server_..._0), SHA-256 suite.
class record_writer {
 public:
  // Throws std::runtime_error on a wrong size / OpenSSL failure. `pool`
  // (optional) must outlive the writer. records_per_key (at least 2; tests
  // lower it) is when the writer updates its keys.
  explicit record_writer(const std::string& traffic_secret, fork_join_pool* pool = nullptr,
                         uint64_t records_per_key = default_records_per_key);
  ~record_writer();
  record_writer(const record_writer&) = delete;
  record_writer& operator=(const record_writer&) = delete;

  // Seals `n` bytes of application data into records of at most 16384
  // plaintext bytes each (with KeyUpdate records where the keys change),
  // appended to `out`. Nothing for n == 0. Throws std::runtime_error on an
  // OpenSSL failure, and on every call after any failure.
  void seal(const char* data, std::size_t n, std::vector<char>& out);
  // The same into `dst`, which has room for max_sealed_size(n) bytes (a
  // buffer reused across calls, never zero-filled); returns the bytes
  // sealed: sealed_size(n), plus key_update_size for each key update.
  std::size_t seal_to(const char* data, std::size_t n, char* dst);
  // The same, calling sealed(k) as dst's first k bytes become whole sealed
  // records (every min_parallel_records records or so, the last call with
  // k == the bytes sealed), so that the caller sends them while the
  // records after them are sealed. If sealing (or `sealed`) fails, it
  // throws after the calls made so far, never with a k that covers the
  // failed record, and the writer is failed for good.
  std::size_t seal_to(const char* data, std::size_t n, char* dst,
                      const std::function<void(std::size_t)>& sealed);
  // The bytes of n bytes of application data in records, without key updates.
  static std::size_t sealed_size(std::size_t n);
  // Room seal_to needs for n bytes, key updates included.
  std::size_t max_sealed_size(std::size_t n) const;
  // A close_notify alert (level 1, description 0) as one sealed record.
  void seal_close_notify(std::vector<char>& out);
  // A fatal alert (level 2) with `description` (tls13::alert), one record.
  void seal_alert(unsigned char description, std::vector<char>& out);
  // The next record sealed is a KeyUpdate (the peer asked for one).
  void request_key_update() { update_due_ = true; }
  uint64_t records() const { return records_; }  // sealed so far, under every key
  uint64_t key_updates() const { return key_updates_; }
  bool failed() const { return failed_; }

 private:
  // Record `seq` into dst with the context of `lane`; false on an OpenSSL
  // failure.
  bool seal_record(unsigned lane, uint64_t seq, const unsigned char* data, std::size_t n,
                   unsigned char type, char* dst);
  bool key_update_due() const { return update_due_ || seq_ + 1 >= records_per_key_; }
  // A KeyUpdate record at dst, then the next keys; returns key_update_size.
  std::size_t seal_key_update(char* dst);
  // n bytes (all under the current key) as records at dst, on the pool's
  // lanes when there are enough; sealed(base + k) as they are ready.
  std::size_t seal_run(const unsigned char* src, std::size_t n, char* dst, std::size_t base,
                       const std::function<void(std::size_t)>& sealed);
  void seal_alert_record(unsigned char level, unsigned char description, std::vector<char>& out);

  traffic_contexts keys_;
  fork_join_pool* pool_ = nullptr;
  uint64_t records_per_key_;
  uint64_t seq_ = 0;  // the next sequence number under the current key
  uint64_t records_ = 0;
  uint64_t key_updates_ = 0;
  bool update_due_ = false;
  bool failed_ = false;
};

class record_reader {
 public:
  explicit record_reader(const std::string& traffic_secret, fork_join_pool* pool = nullptr);
  ~record_reader() = default;
  record_reader(const record_reader&) = delete;
  record_reader& operator=(const record_reader&) = delete;

  // Feeds wire bytes (cut anywhere: partial headers and records are kept for
  // the next call); appends the application data of every complete record to
  // `out`. Returns "" or why the stream is bad; after an error the reader
  // stays failed (returns the same error, appends nothing). After the
  // peer's close_notify, closed() is true and later bytes are ignored.
  std::string feed(const char* data, std::size_t n, std::vector<char>& out);
  // The same into `out`, which has room for max_output(n) bytes; *produced
  // says how many it holds.
  std::string feed_to(const char* data, std::size_t n, char* out, std::size_t* produced);
  std::size_t max_output(std::size_t n) const;
  bool closed() const { return closed_; }
  uint64_t records() const { return records_; }  // opened so far, under every key
  uint64_t key_updates() const { return key_updates_; }
  // True once after a peer's KeyUpdate asked this end to update its keys.
  bool take_key_update_request() { return std::exchange(update_requested_, false); }
  // The alert this end owes the peer for the error feed returned (RFC 8446
  // 6.2); none while there is no error, or when the peer's alert ended it.
  std::optional<unsigned char> alert() const { return error_.empty() ? std::nullopt : alert_; }

 private:
  // One complete record (header + body) at `rec`; "" or the error.
  // Its application data goes to `out` (room for body - 16 bytes), *produced
  // bytes of it.
  std::string open_record(const unsigned char* rec, std::size_t body, char* out,
                          std::size_t* produced);
  // The whole application-data records at the start of p[0, left), when
  // there are min_parallel_records or more, decrypted on the pool's lanes
  // and then taken in order as open_record would; p, left, out and
  // *produced advance past what was taken. "" or the error.
  std::string open_run(const unsigned char*& p, std::size_t& left, char*& out,
                       std::size_t* produced);
  // AES-GCM of record `seq` with the context of `lane`: false if it fails
  // authentication. Leaves the inner plaintext (body - 16 bytes) at `out`.
  bool decrypt_record(unsigned lane, uint64_t seq, const unsigned char* rec, std::size_t body,
                      unsigned char* out);
  // After decryption: the inner plaintext of clen bytes at `out` read as
  // RFC 8446 5.4 says (padding, content type, alerts); counts the record.
  std::string finish_record(unsigned char* out, std::size_t clen, std::size_t* produced);
  // The header at `h`: "" or the error; sets *body to the body length.
  std::string check_header(const unsigned char* h, std::size_t* body);
  // An alert record's content: "" for a close_notify, else why the link ends.
  std::string read_alert(const unsigned char* content, std::size_t n);
  // A handshake record's content: "" for a KeyUpdate (the keys updated),
  // else why the link ends.
  std::string read_key_update(const unsigned char* content, std::size_t n);
  // Notes the alert owed for `why`; returns why.
  std::string refuse(unsigned char description, std::string why);

  struct run_record {
    const unsigned char* rec;
    std::size_t body;
    std::size_t at;  // where its plaintext is decrypted, from `out`
    bool authentic;
  };
  traffic_contexts keys_;
  fork_join_pool* pool_ = nullptr;
  std::vector<run_record> run_;
  uint64_t seq_ = 0;  // the next sequence number under the current key
  uint64_t records_ = 0;
  uint64_t key_updates_ = 0;
  std::vector<unsigned char> pending_;  // a partial record from earlier calls
  std::string error_;
  std::optional<unsigned char> alert_;
  bool closed_ = false;
  bool rekeyed_ = false;  // the last record opened updated the keys
  bool update_requested_ = false;
};

}  // namespace troupe::tls13
