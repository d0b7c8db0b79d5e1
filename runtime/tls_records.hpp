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
// result is the same bytes and the same errors as one by one. No KeyUpdate, no post-handshake
// messages: a peer that sends one fails the reader (these links never ask
// for one, and OpenSSL sends none unprompted with num_tickets 0).
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
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

struct traffic_keys {
  std::array<unsigned char, 16> key{};
  std::array<unsigned char, 12> iv{};
};

// key = HKDF-Expand-Label(secret, "key", "", 16), iv = ...("iv", "", 12),
// over SHA-256. `secret` must be 32 bytes; throws std::runtime_error.
traffic_keys derive_traffic_keys(const std::string& secret);

// traffic_secret: the 32-byte application traffic secret of one direction
// (client_application_traffic_secret_0 or server_..._0), SHA-256 suite.
class record_writer {
 public:
  // Throws std::runtime_error on a wrong size / OpenSSL failure. `pool`
  // (optional) must outlive the writer.
  explicit record_writer(const std::string& traffic_secret, fork_join_pool* pool = nullptr);
  ~record_writer();
  record_writer(const record_writer&) = delete;
  record_writer& operator=(const record_writer&) = delete;

  // Seals `n` bytes of application data into records of at most 16384
  // plaintext bytes each, appended to `out`. Nothing for n == 0. Throws
  // std::runtime_error on an OpenSSL failure or an exhausted sequence.
  void seal(const char* data, std::size_t n, std::vector<char>& out);
  // The same into `dst`, which has room for sealed_size(n) bytes (a buffer
  // reused across calls, never zero-filled); returns sealed_size(n).
  std::size_t seal_to(const char* data, std::size_t n, char* dst);
  // The same, calling sealed(k) as dst's first k bytes become whole sealed
  // records (every min_parallel_records records or so, the last call with
  // k == sealed_size(n)), so that the caller sends them while the records
  // after them are sealed. If sealing fails, it throws after the calls
  // made so far, never with a k that covers the failed record.
  std::size_t seal_to(const char* data, std::size_t n, char* dst,
                      const std::function<void(std::size_t)>& sealed);
  static std::size_t sealed_size(std::size_t n);
  // A close_notify alert (level 1, description 0) as one sealed record.
  void seal_close_notify(std::vector<char>& out);
  uint64_t records() const { return seq_; }  // sealed so far (= the next sequence number)

 private:
  // Record `seq` into dst with the context of `lane`; false on an OpenSSL
  // failure.
  bool seal_record(unsigned lane, uint64_t seq, const unsigned char* data, std::size_t n,
                   unsigned char type, char* dst);

  std::vector<EVP_CIPHER_CTX*> ctx_;  // one per lane of the pool (or one)
  fork_join_pool* pool_ = nullptr;
  std::array<unsigned char, 12> iv_{};
  uint64_t seq_ = 0;
};

class record_reader {
 public:
  explicit record_reader(const std::string& traffic_secret, fork_join_pool* pool = nullptr);
  ~record_reader();
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
  uint64_t records() const { return seq_; }  // opened so far (CCS not counted)

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

  struct run_record {
    const unsigned char* rec;
    std::size_t body;
    std::size_t at;  // where its plaintext is decrypted, from `out`
    bool authentic;
  };
  std::vector<EVP_CIPHER_CTX*> ctx_;  // one per lane of the pool (or one)
  fork_join_pool* pool_ = nullptr;
  std::vector<run_record> run_;
  std::array<unsigned char, 12> iv_{};
  uint64_t seq_ = 0;
  std::vector<unsigned char> pending_;  // a partial record from earlier calls
  std::string error_;
  bool closed_ = false;
  bool seen_ccs_ = false;
};

}  // namespace troupe::tls13
