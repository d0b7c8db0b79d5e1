// TLS 1.3 record protection of our own (net/tls_records.hpp): the
// RFC 8448 traffic keys, records that real OpenSSL reads and writes, and a
// reader that refuses altered, replayed, reordered and foreign records.
#include <doctest/doctest.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "net/fork_join_pool.hpp"
#include "net/tls_records.hpp"

using namespace troupe::tls13;

namespace {

std::string unhex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

template <std::size_t N>
std::string to_hex(const std::array<unsigned char, N>& a) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : a) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

std::vector<char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

const std::string kSecret(32, 'k');

// A record sealed by hand, independently of record_writer: `content`, inner
// type `type`, then `padding` zero bytes, as sequence number `seq`.
std::vector<char> hand_seal(const std::string& secret, uint64_t seq, const std::string& content,
                            unsigned char type, std::size_t padding = 0) {
  traffic_keys k = derive_traffic_keys(secret);
  std::string inner = content;
  inner.push_back(static_cast<char>(type));
  inner.append(padding, '\0');
  const std::size_t body = inner.size() + 16;
  std::vector<char> rec(5 + body);
  auto* h = reinterpret_cast<unsigned char*>(rec.data());
  h[0] = 23;
  h[1] = 3;
  h[2] = 3;
  h[3] = static_cast<unsigned char>(body >> 8);
  h[4] = static_cast<unsigned char>(body);
  unsigned char nonce[12];
  std::memcpy(nonce, k.iv.data(), 12);
  for (int i = 0; i < 8; ++i) nonce[11 - i] ^= static_cast<unsigned char>(seq >> (8 * i));
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int len = 0;
  bool ok =
      EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, k.key.data(), nonce) == 1 &&
      EVP_EncryptUpdate(ctx, nullptr, &len, h, 5) == 1 &&
      EVP_EncryptUpdate(ctx, h + 5, &len, reinterpret_cast<const unsigned char*>(inner.data()),
                        static_cast<int>(inner.size())) == 1 &&
      EVP_EncryptFinal_ex(ctx, h + 5 + inner.size(), &len) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, h + 5 + inner.size()) == 1;
  EVP_CIPHER_CTX_free(ctx);
  if (!ok) throw std::runtime_error("hand_seal failed");
  return rec;
}

std::vector<char> cat(std::initializer_list<std::vector<char>> parts) {
  std::vector<char> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string feed_all(record_reader& r, const std::vector<char>& wire, std::vector<char>& out) {
  return r.feed(wire.data(), wire.size(), out);
}

// ------------------------------------------------ two OpenSSL endpoints

struct keylog {
  std::string client_secret, server_secret;
};

void on_keylog(const SSL* ssl, const char* line) {
  auto* k = static_cast<keylog*>(SSL_get_ex_data(ssl, 0));
  std::string s(line);
  auto field = [&](const std::string& label) -> std::string {
    if (s.rfind(label + " ", 0) != 0) return "";
    return unhex(s.substr(s.rfind(' ') + 1));
  };
  if (auto c = field("CLIENT_TRAFFIC_SECRET_0"); !c.empty()) k->client_secret = c;
  if (auto v = field("SERVER_TRAFFIC_SECRET_0"); !v.empty()) k->server_secret = v;
}

SSL_CTX* make_ctx(bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  REQUIRE(ctx);
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  REQUIRE(SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") == 1);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_read_ahead(ctx, 0);
  SSL_CTX_set_keylog_callback(ctx, on_keylog);
  if (server) {  // a self-signed certificate; the client does not verify it
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("records"), -1, -1, 0);
    X509_set_issuer_name(x, name);
    REQUIRE(X509_sign(x, key, EVP_sha256()) > 0);
    REQUIRE(SSL_CTX_use_certificate(ctx, x) == 1);
    REQUIRE(SSL_CTX_use_PrivateKey(ctx, key) == 1);
    X509_free(x);
    EVP_PKEY_free(key);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  }
  return ctx;
}

struct endpoint {
  explicit endpoint(bool server) : ctx(make_ctx(server)), ssl(SSL_new(ctx)) {
    in = BIO_new(BIO_s_mem());
    out = BIO_new(BIO_s_mem());
    SSL_set_bio(ssl, in, out);  // the SSL owns both
    SSL_set_ex_data(ssl, 0, &secrets);
    if (server)
      SSL_set_accept_state(ssl);
    else
      SSL_set_connect_state(ssl);
  }
  ~endpoint() {
    SSL_free(ssl);
    SSL_CTX_free(ctx);
  }
  std::vector<char> take_output() {
    std::vector<char> v;
    char buf[16384];
    int n;
    while ((n = BIO_read(out, buf, sizeof buf)) > 0) v.insert(v.end(), buf, buf + n);
    return v;
  }
  void give_input(const std::vector<char>& v) {
    if (!v.empty()) REQUIRE(BIO_write(in, v.data(), static_cast<int>(v.size())) == int(v.size()));
  }
  SSL_CTX* ctx;
  SSL* ssl;
  BIO* in = nullptr;
  BIO* out = nullptr;
  keylog secrets;
};

void handshake(endpoint& client, endpoint& server) {
  bool c_done = false, s_done = false;
  for (int i = 0; i < 20 && !(c_done && s_done); ++i) {
    if (!c_done) c_done = SSL_do_handshake(client.ssl) == 1;
    server.give_input(client.take_output());
    if (!s_done) s_done = SSL_do_handshake(server.ssl) == 1;
    client.give_input(server.take_output());
  }
  REQUIRE(c_done);
  REQUIRE(s_done);
  // Nothing in flight: no tickets (num_tickets 0), the client's Finished read.
  REQUIRE(client.take_output().empty());
  REQUIRE(server.take_output().empty());
  REQUIRE(BIO_ctrl_pending(client.in) == 0);
  REQUIRE(BIO_ctrl_pending(server.in) == 0);
}

}  // namespace

TEST_CASE("traffic keys: the RFC 8448 Simple 1-RTT Handshake's application keys") {
  // RFC 8448 section 3: server_application_traffic_secret_0 and the keys
  // "derive write traffic keys for application data".
  traffic_keys s = derive_traffic_keys(
      unhex("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643"));
  CHECK(to_hex(s.key) == "9f02283b6c9c07efc26bb9f2ac92e356");
  CHECK(to_hex(s.iv) == "cf782b88dd83549aadf1e984");
  // client_application_traffic_secret_0 of the same trace.
  traffic_keys c = derive_traffic_keys(
      unhex("9e40646ce79a7f9dc05af8889bce6552875afa0b06df0087f792ebb7c17504a5"));
  CHECK(to_hex(c.key) == "17422dda596ed5d9acd890e3c63f5051");
  CHECK(to_hex(c.iv) == "5b78923dee08579033e523d9");
  // Its server handshake traffic secret (same derivation, other label input).
  traffic_keys h = derive_traffic_keys(
      unhex("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38"));
  CHECK(to_hex(h.key) == "3fce516009c21727d0f2e4e86ee403bc");
  CHECK(to_hex(h.iv) == "5d313eb2671276ee13000b30");

  CHECK_THROWS_AS(derive_traffic_keys(std::string(31, 'x')), std::runtime_error);
  CHECK_THROWS_AS(record_writer(std::string(48, 'x')), std::runtime_error);
  CHECK_THROWS_AS(record_reader(""), std::runtime_error);
}

TEST_CASE("records: real OpenSSL reads what we seal and we read what it writes") {
  endpoint client(false), server(true);
  handshake(client, server);
  REQUIRE(client.secrets.client_secret.size() == 32);
  REQUIRE(client.secrets.server_secret.size() == 32);
  CHECK(server.secrets.client_secret == client.secrets.client_secret);
  CHECK(server.secrets.server_secret == client.secrets.server_secret);

  // (a) Server to client: our writer, OpenSSL's SSL_read.
  record_writer writer(client.secrets.server_secret);
  auto big = random_bytes(100 * 1024, 1), one = random_bytes(1, 2), full = random_bytes(16384, 3);
  std::vector<char> wire;
  writer.seal(big.data(), big.size(), wire);
  writer.seal(one.data(), one.size(), wire);
  writer.seal(full.data(), full.size(), wire);
  CHECK(writer.records() == 7 + 1 + 1);
  CHECK(wire.size() == big.size() + one.size() + full.size() + 9 * 22);
  client.give_input(wire);
  std::vector<char> expected = cat({big, one, full}), got;
  char buf[20000];
  while (got.size() < expected.size()) {
    int n = SSL_read(client.ssl, buf, sizeof buf);
    REQUIRE_MESSAGE(n > 0, "SSL_read failed: error " << SSL_get_error(client.ssl, n));
    got.insert(got.end(), buf, buf + n);
  }
  CHECK(got == expected);

  // (b) Client to server: OpenSSL's SSL_write, our reader, fed in random cuts.
  record_reader reader(client.secrets.client_secret);
  auto sent = random_bytes(70000, 4);
  REQUIRE(SSL_write(client.ssl, sent.data(), static_cast<int>(sent.size())) == int(sent.size()));
  auto from_client = client.take_output();
  std::mt19937 rng(5);
  std::vector<char> read;
  for (std::size_t at = 0; at < from_client.size();) {
    std::size_t cut = std::min<std::size_t>(1 + rng() % 700, from_client.size() - at);
    REQUIRE(reader.feed(from_client.data() + at, cut, read) == "");
    at += cut;
  }
  CHECK(read == sent);
  CHECK(reader.records() >= 5);
  CHECK_FALSE(reader.closed());

  // (c) close_notify both ways.
  std::vector<char> bye;
  writer.seal_close_notify(bye);
  client.give_input(bye);
  int n = SSL_read(client.ssl, buf, sizeof buf);
  CHECK(n <= 0);
  CHECK(SSL_get_error(client.ssl, n) == SSL_ERROR_ZERO_RETURN);
  CHECK(SSL_shutdown(client.ssl) == 1);  // sends its close_notify; it had the peer's
  auto shut = client.take_output();
  REQUIRE_FALSE(shut.empty());
  read.clear();
  CHECK(reader.feed(shut.data(), shut.size(), read) == "");
  CHECK(reader.closed());
  CHECK(read.empty());
  // Later bytes are ignored.
  CHECK(reader.feed("garbage", 7, read) == "");
  CHECK(read.empty());
}

TEST_CASE("records: our writer and reader, padding, cuts and the bytes after close_notify") {
  record_writer w(kSecret);
  std::vector<char> wire;
  w.seal("abc", 3, wire);
  CHECK(wire == hand_seal(kSecret, 0, "abc", 23));  // the helper below seals like the writer
  w.seal("", 0, wire);                              // nothing at all
  CHECK(w.records() == 1);

  record_reader r(kSecret);
  std::vector<char> out;
  // A padded record (RFC 8446 5.4): the zeros go, the content stays.
  auto padded = cat({hand_seal(kSecret, 0, "hello", 23, 300), hand_seal(kSecret, 1, "", 23)});
  CHECK(feed_all(r, padded, out) == "");
  CHECK(std::string(out.begin(), out.end()) == "hello");

  // Fed one byte at a time.
  record_writer w2(kSecret);
  record_reader r2(kSecret);
  auto data = random_bytes(40000, 9);
  wire.clear();
  w2.seal(data.data(), data.size(), wire);
  w2.seal_close_notify(wire);
  auto tail = hand_seal(kSecret, w2.records(), "after the close", 23);
  wire.insert(wire.end(), tail.begin(), tail.end());
  out.clear();
  for (char c : wire) REQUIRE(r2.feed(&c, 1, out) == "");
  CHECK(out == data);  // nothing after the close_notify
  CHECK(r2.closed());
  CHECK(r2.records() == 4);
}

TEST_CASE("records: a flipped bit, a replay or a reorder never gives data") {
  record_writer w(kSecret);
  auto m0 = random_bytes(1000, 10), m1 = random_bytes(1000, 11), m2 = random_bytes(1000, 12);
  std::vector<char> r0, r1, r2;
  w.seal(m0.data(), m0.size(), r0);
  w.seal(m1.data(), m1.size(), r1);
  w.seal(m2.data(), m2.size(), r2);
  const auto stream = cat({r0, r1, r2});
  const std::vector<char> zeros(20000, 0);

  // Every bit of the first record, its 5-byte header included. A length byte
  // that grows the record past the bytes given only waits; the zeros that
  // follow then complete it (and fail it) or make a bad header.
  int header_errors = 0;
  for (std::size_t pos = 0; pos < r0.size(); ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = stream;
      bad[pos] = static_cast<char>(bad[pos] ^ (1 << bit));
      record_reader r(kSecret);
      std::vector<char> out;
      std::string err = feed_all(r, bad, out);
      if (err.empty()) {
        REQUIRE((pos == 3 || pos == 4));
        err = feed_all(r, zeros, out);
      }
      INFO("byte " << pos << " bit " << bit << ": " << err);
      REQUIRE(out.empty());
      REQUIRE_FALSE(err.empty());
      if (pos >= 5) {
        REQUIRE(err.find("decrypt") != std::string::npos);
        REQUIRE(err.find("bad record mac") != std::string::npos);
      } else if (err.find("decrypt") == std::string::npos) {
        ++header_errors;
      }
      CHECK(feed_all(r, r1, out) == err);  // it stays failed
      REQUIRE(out.empty());
    }
  }
  CHECK(header_errors > 0);

  // A flipped tag bit in the last record: the first two records' data only.
  {
    auto bad = stream;
    const std::size_t tag_byte = r0.size() + r1.size() + r2.size() - 1;
    bad.at(tag_byte) = static_cast<char>(bad.at(tag_byte) ^ 0x80);
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r, bad, out).find("decrypt") != std::string::npos);
    CHECK(out == cat({m0, m1}));
  }
  // Replayed: record 0 again after record 1.
  {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r, cat({r0, r1, r0}), out).find("bad record mac") != std::string::npos);
    CHECK(out == cat({m0, m1}));
  }
  // Reordered: record 1 first.
  {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r, cat({r1, r0}), out).find("decrypt") != std::string::npos);
    CHECK(out.empty());
  }
  // Sealed with another key.
  {
    record_reader r(std::string(32, 'j'));
    std::vector<char> out;
    CHECK(feed_all(r, r0, out).find("decrypt") != std::string::npos);
    CHECK(out.empty());
  }
}

TEST_CASE("records: bad headers, change_cipher_spec, alerts and post-handshake messages") {
  auto fails = [](const std::vector<char>& wire, const std::string& expect) {
    record_reader r(kSecret);
    std::vector<char> out;
    std::string err = feed_all(r, wire, out);
    INFO("error: " << err);
    CHECK(err.find(expect) != std::string::npos);
    CHECK(out.empty());
    CHECK_FALSE(r.closed());
    // An alert is owed for every error but the peer's own alert.
    CHECK(r.alert().has_value() == (err.find("the peer sent TLS alert") == std::string::npos));
    return err;
  };
  auto bytes = [](std::initializer_list<int> v) {
    std::vector<char> out;
    for (int b : v) out.push_back(static_cast<char>(b));
    return out;
  };
  const auto good = hand_seal(kSecret, 0, "data", 23);

  // Lengths: 16640 is TLS's limit (only waits for more), 16641 is over it.
  {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r, bytes({23, 3, 3, 0x41, 0x00}), out) == "");
  }
  fails(bytes({23, 3, 3, 0x41, 0x01}), "a record of 16641 bytes, over TLS's limit");
  fails(bytes({23, 3, 3, 0xff, 0xff}), "a record of 65535 bytes, over TLS's limit");
  fails(bytes({23, 3, 3, 0, 16}), "too short");
  // Types and versions.
  fails(bytes({22, 3, 3, 0, 40}), "not a TLS 1.3 application data record");
  fails(bytes({21, 3, 3, 0, 2, 2, 40}), "not a TLS 1.3 application data record");
  fails(bytes({23, 3, 1, 0, 40}), "not a TLS 1.3 application data record");
  fails(bytes({23, 3, 4, 0, 40}), "not a TLS 1.3 application data record");
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  fails(std::vector<char>(http.begin(), http.end()), "not a TLS 1.3 application data record");
  // A bad header cut in two is found once whole.
  {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(r.feed("\x16\x03", 2, out) == "");
    CHECK(r.feed("\x03\x00\x10", 3, out).find("not a TLS 1.3") != std::string::npos);
    CHECK(feed_all(r, good, out).find("not a TLS 1.3") != std::string::npos);  // stays failed
    CHECK(out.empty());
  }

  // change_cipher_spec: the reader starts after the peer's Finished, after
  // which TLS 1.3 allows none (RFC 8446 5): refused, first or later.
  const auto ccs = bytes({20, 3, 3, 0, 1, 1});
  const std::string after = "a change_cipher_spec record after the handshake";
  fails(cat({ccs, good}), after);
  {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r, cat({good, ccs, good}), out).find(after) != std::string::npos);
    CHECK(std::string(out.begin(), out.end()) == "data");
    CHECK(r.alert() == alert::unexpected_message);
  }
  fails(bytes({20, 3, 3, 0, 1, 2}), after);
  fails(bytes({20, 3, 3, 0, 2, 1, 1}), after);
  {  // even its first two bytes are enough
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(r.feed("\x14\x03", 2, out) == "");
    CHECK(r.feed("\x03\x00\x01\x01", 4, out).find(after) != std::string::npos);
  }

  // Alerts.
  fails(hand_seal(kSecret, 0, "\x02\x28", 21), "the peer sent TLS alert 40 (handshake_failure)");
  fails(hand_seal(kSecret, 0, "\x02\x74", 21),
        "the peer sent TLS alert 116 (certificate_required)");
  fails(hand_seal(kSecret, 0, "\x02\x30", 21), "the peer sent TLS alert 48 (unknown_ca)");
  fails(hand_seal(kSecret, 0, "\x02\x0a", 21), "the peer sent TLS alert 10 (unexpected_message)");
  fails(hand_seal(kSecret, 0, "\x01\x2d", 21), "the peer sent TLS alert 45 (certificate_expired)");
  fails(hand_seal(kSecret, 0, "\x02\x50", 21), "the peer sent TLS alert 80 (internal_error)");
  fails(hand_seal(kSecret, 0, "\x02", 21), "malformed TLS alert");
  fails(hand_seal(kSecret, 0, std::string("\x03\x00", 2), 21), "close_notify alert with level 3");
  {  // a fatal-level close_notify, padded, still closes
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r,
                   cat({good, hand_seal(kSecret, 1, std::string("\x02\x00", 2), 21, 7),
                        bytes({1, 2, 3})}),
                   out) == "");
    CHECK(r.closed());
    CHECK(std::string(out.begin(), out.end()) == "data");
  }
  // Post-handshake messages: a NewSessionTicket (4) is refused; a KeyUpdate
  // (24) only as exactly one message, alone in its record.
  fails(hand_seal(kSecret, 0, std::string("\x04\x00\x00\x00", 4), 22),
        "the peer sent a post-handshake message (type 4), which these links do not take");
  fails(hand_seal(kSecret, 0, std::string("\x18\x00\x00\x01\x02", 5), 22), "a malformed KeyUpdate");
  fails(hand_seal(kSecret, 0, std::string("\x18\x00\x00\x02\x00\x00", 6), 22),
        "a malformed KeyUpdate");
  fails(hand_seal(kSecret, 0, std::string("\x18\x00\x00\x01\x00\x18\x00\x00\x01\x00", 10), 22),
        "a malformed KeyUpdate");
  {  // after a KeyUpdate, a record under the old keys fails
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r,
                   cat({good, hand_seal(kSecret, 1, std::string("\x18\x00\x00\x01\x00", 5), 22),
                        hand_seal(kSecret, 0, "old", 23)}),
                   out)
              .find("bad record mac") != std::string::npos);
    CHECK(std::string(out.begin(), out.end()) == "data");
    CHECK(r.key_updates() == 1);
    CHECK(r.alert() == alert::bad_record_mac);
  }
  // No content type, an unknown one.
  fails(hand_seal(kSecret, 0, "", 0, 40), "all zeros");
  fails(hand_seal(kSecret, 0, "x", 99), "unknown inner content type 99");
  // Too much plaintext inside a record of allowed size.
  fails(hand_seal(kSecret, 0, std::string(16385, 'x'), 23), "record_overflow");
  // A record_overflow record but with exactly 16384 + type: fine.
  {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r, hand_seal(kSecret, 0, std::string(16384, 'x'), 23), out) == "");
    CHECK(out.size() == 16384);
  }
}

TEST_CASE("records: keys updated every records_per_key records; real OpenSSL follows both ways") {
  endpoint client(false), server(true);
  handshake(client, server);
  // (a) Our writer, 3 records a key (two of data, then the KeyUpdate), in
  // calls of every size, on a pool and not; OpenSSL reads all of it.
  troupe::fork_join_pool pool(2);
  record_writer writer(client.secrets.server_secret, &pool, 3);
  std::vector<char> wire, sent;
  for (std::size_t n : {1, 16384, 16385, 5 * 16384 + 3, 1, 1, 200000}) {
    auto data = random_bytes(n, static_cast<unsigned>(n));
    writer.seal(data.data(), n, wire);
    sent.insert(sent.end(), data.begin(), data.end());
  }
  const uint64_t data_records = 1 + 1 + 2 + 6 + 1 + 1 + 13;
  CHECK(writer.key_updates() == (data_records - 1) / 2);  // one after every two
  CHECK(writer.records() == data_records + writer.key_updates());
  client.give_input(wire);
  std::vector<char> got;
  char buf[20000];
  while (got.size() < sent.size()) {
    int n = SSL_read(client.ssl, buf, sizeof buf);
    REQUIRE_MESSAGE(n > 0, "SSL_read failed: error " << SSL_get_error(client.ssl, n));
    got.insert(got.end(), buf, buf + n);
  }
  CHECK(got == sent);
  // ... and our own reader, one by one and in runs.
  for (troupe::fork_join_pool* p : {static_cast<troupe::fork_join_pool*>(nullptr), &pool}) {
    record_reader reader(client.secrets.server_secret, p);
    std::vector<char> out;
    CHECK(feed_all(reader, wire, out) == "");
    CHECK(out == sent);
    CHECK(reader.key_updates() == writer.key_updates());
  }

  // (b) OpenSSL updates its keys and asks for ours; our reader follows and
  // says so once; our writer's next records are under new keys, which
  // OpenSSL reads.
  record_reader reader(client.secrets.client_secret);
  REQUIRE(SSL_key_update(client.ssl, SSL_KEY_UPDATE_REQUESTED) == 1);
  REQUIRE(SSL_write(client.ssl, "after", 5) == 5);
  std::vector<char> out;
  CHECK(feed_all(reader, client.take_output(), out) == "");
  CHECK(std::string(out.begin(), out.end()) == "after");
  CHECK(reader.key_updates() == 1);
  CHECK(reader.take_key_update_request());
  CHECK_FALSE(reader.take_key_update_request());
  const uint64_t updates = writer.key_updates();
  writer.request_key_update();
  wire.clear();
  writer.seal("reply", 5, wire);
  CHECK(writer.key_updates() == updates + 1);
  client.give_input(wire);
  int n = SSL_read(client.ssl, buf, sizeof buf);
  REQUIRE(n == 5);
  CHECK(std::string(buf, 5) == "reply");
  // OpenSSL's writes go on under its new keys.
  REQUIRE(SSL_write(client.ssl, "more", 4) == 4);
  out.clear();
  CHECK(feed_all(reader, client.take_output(), out) == "");
  CHECK(std::string(out.begin(), out.end()) == "more");
}

TEST_CASE("records: a failed seal leaves the writer failed, so no nonce is used twice") {
  troupe::fork_join_pool pool(0);
  record_writer w(kSecret, &pool);
  auto data = random_bytes(8 * 16384, 31);
  std::vector<char> dst(w.max_sealed_size(data.size()));
  std::size_t handed = 0;
  // The caller's hand-on fails (e.g. a send that throws) after 4 records.
  CHECK_THROWS_WITH(w.seal_to(data.data(), data.size(), dst.data(),
                              [&](std::size_t k) {
                                handed = k;
                                throw std::runtime_error("the socket went away");
                              }),
                    "the socket went away");
  CHECK(w.failed());
  CHECK(handed == 4 * (16384 + 22));
  // Those 4 records went out; sealing anything more (data or an alert)
  // would reuse their sequence numbers: refused.
  std::vector<char> more;
  CHECK_THROWS_WITH(w.seal("x", 1, more), doctest::Contains("failed before"));
  CHECK_THROWS_WITH(w.seal_close_notify(more), doctest::Contains("failed before"));
  CHECK_THROWS_WITH(w.seal_alert(alert::internal_error, more), doctest::Contains("failed before"));
  CHECK(more.empty());
  // What went out is intact.
  record_reader r(kSecret);
  std::vector<char> out;
  CHECK(r.feed(dst.data(), handed, out) == "");
  CHECK(out == std::vector<char>(data.begin(), data.begin() + 4 * 16384));
}

TEST_CASE("records: the alert owed for each error, and sealed alerts") {
  record_writer w(kSecret);
  std::vector<char> wire;
  w.seal("abc", 3, wire);
  auto owed = [&](std::vector<char> bytes) {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK_FALSE(feed_all(r, bytes, out).empty());
    return r.alert();
  };
  auto flipped = wire;
  flipped.back() ^= 1;
  CHECK(owed(flipped) == alert::bad_record_mac);
  CHECK(owed({23, 3, 3, 0x41, 0x01}) == alert::record_overflow);
  CHECK(owed({22, 3, 3, 0, 40}) == alert::unexpected_message);
  CHECK(owed({23, 3, 3, 0, 16}) == alert::decode_error);
  CHECK(owed(hand_seal(kSecret, 0, "x", 99)) == alert::unexpected_message);
  CHECK(owed(hand_seal(kSecret, 0, "\x02\x28", 21)) == std::nullopt);  // the peer's own alert
  {
    record_reader r(kSecret);
    std::vector<char> out;
    CHECK(feed_all(r, wire, out) == "");
    CHECK(r.alert() == std::nullopt);  // no error, nothing owed
  }
  // A fatal alert we seal is read as that alert.
  std::vector<char> fatal = wire;
  w.seal_alert(alert::bad_record_mac, fatal);
  record_reader r(kSecret);
  std::vector<char> out;
  CHECK(feed_all(r, fatal, out) == "the peer sent TLS alert 20 (bad_record_mac)");
  CHECK(std::string(out.begin(), out.end()) == "abc");
}

TEST_CASE("records: a key update against a new handshake (informational)") {
  using clock = std::chrono::steady_clock;
  constexpr int updates = 2000;
  record_writer w(kSecret, nullptr, 2);  // every data record is followed by a KeyUpdate
  std::vector<char> wire;
  auto t0 = clock::now();
  for (int i = 0; i < updates; ++i) {
    wire.clear();
    w.seal("x", 1, wire);
  }
  const double update_us =
      std::chrono::duration<double, std::micro>(clock::now() - t0).count() / updates;
  CHECK(w.key_updates() == updates - 1);
  constexpr int handshakes = 50;
  t0 = clock::now();
  for (int i = 0; i < handshakes; ++i) {
    endpoint client(false), server(true);
    handshake(client, server);
  }
  const double handshake_us =
      std::chrono::duration<double, std::micro>(clock::now() - t0).count() / handshakes;
  MESSAGE("a KeyUpdate (seal, new secret, new keys): " << update_us
                                                       << " us; a TLS 1.3 handshake in memory "
                                                          "(contexts and certificate included): "
                                                       << handshake_us << " us");
}

TEST_CASE("fork_join_pool: every part once, on distinct lanes, with callers side by side") {
  troupe::fork_join_pool pool(3);
  REQUIRE(pool.lanes() == 4);
  constexpr std::size_t callers = 4, runs = 200, parts = 37;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (std::size_t c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      for (std::size_t run = 0; run < runs; ++run) {
        std::vector<std::atomic<int>> hits(parts);
        std::array<std::atomic<int>, 4> in_lane{};  // a lane is one participant at a time
        pool.run(parts, [&](std::size_t i, unsigned lane) {
          if (lane >= 4 || in_lane[lane].fetch_add(1) != 0) ++wrong;
          hits[i].fetch_add(1);
          in_lane[lane].fetch_sub(1);
        });
        for (auto& h : hits)
          if (h.load() != 1) ++wrong;
        (void)c;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
  // Prefixes handed on while later parts run: growing, each whole when
  // handed, the last one everything.
  for (unsigned helpers : {0u, 3u}) {
    troupe::fork_join_pool p(helpers);
    for (int run = 0; run < 200; ++run) {
      std::vector<std::atomic<int>> finished(parts);
      std::vector<std::size_t> handed;
      bool whole = true;
      p.run(
          parts, [&](std::size_t i, unsigned) { finished[i] = 1; },
          [&](std::size_t k) {
            for (std::size_t i = 0; i < k; ++i) whole = whole && finished[i].load() == 1;
            handed.push_back(k);
          },
          4);
      REQUIRE_FALSE(handed.empty());
      CHECK(whole);
      CHECK(handed.back() == parts);
      CHECK(std::is_sorted(handed.begin(), handed.end()));
      CHECK(std::adjacent_find(handed.begin(), handed.end()) == handed.end());
      if (helpers == 0)
        CHECK(handed == std::vector<std::size_t>{4, 8, 12, 16, 20, 24, 28, 32, 36, 37});
    }
  }
  // The helper count from the environment; a bad value is the machine's default.
  {
    ::unsetenv("TROUPE_TLS_CRYPTO_THREADS");
    const unsigned by_cores = troupe::fork_join_pool::default_helpers();
    CHECK(by_cores <= 3);
    ::setenv("TROUPE_TLS_CRYPTO_THREADS", "5", 1);
    CHECK(troupe::fork_join_pool::default_helpers() == 5);
    for (const char* bad : {"16", "-1", "2x", "many"}) {
      ::setenv("TROUPE_TLS_CRYPTO_THREADS", bad, 1);
      CHECK(troupe::fork_join_pool::default_helpers() == by_cores);
    }
    ::unsetenv("TROUPE_TLS_CRYPTO_THREADS");
  }
  // No helpers: the caller's loop, lane 0.
  troupe::fork_join_pool none(0);
  CHECK(none.lanes() == 1);
  std::vector<unsigned> lanes;
  none.run(5, [&](std::size_t, unsigned lane) { lanes.push_back(lane); });
  CHECK(lanes == std::vector<unsigned>(5, 0));
}

TEST_CASE("records on a pool's lanes: the same bytes, data and errors as one by one") {
  troupe::fork_join_pool pool(3);
  // The writer: the same wire as one lane's, around every limit.
  record_writer one(kSecret), lanes(kSecret, &pool);
  std::vector<char> plain, by_one, by_lanes;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{16383}, std::size_t{16384},
                        std::size_t{16385}, std::size_t{3 * 16384}, std::size_t{4 * 16384},
                        std::size_t{4 * 16384 + 7}, std::size_t{256 * 1024}, std::size_t{300001}}) {
    auto data = random_bytes(n, static_cast<unsigned>(n));
    plain.insert(plain.end(), data.begin(), data.end());
    one.seal(data.data(), n, by_one);
    lanes.seal(data.data(), n, by_lanes);
  }
  CHECK(by_lanes == by_one);
  CHECK(lanes.records() == one.records());
  // Sealed records handed on as they are ready: the same bytes, in order.
  for (unsigned helpers : {0u, 3u}) {
    troupe::fork_join_pool p(helpers);
    record_writer w(kSecret, &p), ref(kSecret);
    auto data = random_bytes(300001, 23);
    std::vector<char> dst(w.max_sealed_size(data.size())), expect;
    std::vector<char> handed;
    std::size_t calls = 0;
    w.seal_to(data.data(), data.size(), dst.data(), [&](std::size_t k) {
      ++calls;
      REQUIRE(k >= handed.size());
      handed.insert(handed.end(), dst.begin() + static_cast<std::ptrdiff_t>(handed.size()),
                    dst.begin() + static_cast<std::ptrdiff_t>(k));
    });
    ref.seal(data.data(), data.size(), expect);
    CHECK(handed == expect);
    if (helpers == 0) CHECK(calls == (data.size() + 16383) / 16384 / 4 + 1);  // every 4 records
    // (with helpers, they may seal everything before the caller hands on)
  }

  // The reader: the whole stream at once, and in random cuts.
  {
    record_reader r(kSecret, &pool);
    std::vector<char> out;
    CHECK(feed_all(r, by_lanes, out) == "");
    CHECK(out == plain);
    CHECK(r.records() == one.records());
  }
  {
    record_reader r(kSecret, &pool);
    std::vector<char> out;
    std::mt19937 rng(21);
    for (std::size_t at = 0; at < by_lanes.size();) {
      std::size_t cut = std::min<std::size_t>(1 + rng() % 150000, by_lanes.size() - at);
      REQUIRE(r.feed(by_lanes.data() + at, cut, out) == "");
      at += cut;
    }
    CHECK(out == plain);
  }

  // Padded, empty and full records in one run.
  std::vector<char> run, expected;
  for (uint64_t seq = 0; seq < 10; ++seq) {
    std::string content(seq % 3 == 0 ? 0 : 1000 * seq + 16384 * (seq == 7), char('a' + seq));
    if (content.size() > 16384) content.resize(16384);
    auto rec = hand_seal(kSecret, seq, content, 23, seq % 2 && seq != 7 ? 100 * seq : 0);
    run.insert(run.end(), rec.begin(), rec.end());
    expected.insert(expected.end(), content.begin(), content.end());
  }
  {
    record_reader r(kSecret, &pool);
    std::vector<char> out;
    CHECK(feed_all(r, run, out) == "");
    CHECK(out == expected);
    CHECK(r.records() == 10);
  }
  // The records that precede a bad one are delivered; it is named by its number.
  auto records_of = [&](const std::vector<char>& wire) {
    std::vector<std::size_t> starts;
    for (std::size_t at = 0; at < wire.size();)
      starts.push_back(at),
          at += 5 + ((std::size_t(static_cast<unsigned char>(wire[at + 3])) << 8) |
                     static_cast<unsigned char>(wire[at + 4]));
    return starts;
  };
  const auto starts = records_of(by_lanes);
  REQUIRE(starts.size() > 12);
  {
    auto bad = by_lanes;
    bad[starts[6] + 100] ^= 0x01;
    record_reader r(kSecret, &pool), r_one(kSecret);
    std::vector<char> out, out_one;
    const auto err = feed_all(r, bad, out);
    CHECK(err.find("cannot decrypt record 6 ") != std::string::npos);
    CHECK(err == feed_all(r_one, bad, out_one));
    CHECK(out == out_one);
    CHECK(out.size() == starts[6] - 6 * 22);
    CHECK(std::equal(out.begin(), out.end(), plain.begin()));
  }
  // A close_notify inside a run: what follows it is ignored.
  {
    record_writer w(kSecret);
    auto data = random_bytes(5 * 16384, 22);
    std::vector<char> wire;
    w.seal(data.data(), data.size(), wire);
    w.seal_close_notify(wire);
    w.seal(data.data(), data.size(), wire);
    record_reader r(kSecret, &pool);
    std::vector<char> out;
    CHECK(feed_all(r, wire, out) == "");
    CHECK(r.closed());
    CHECK(out == data);
  }
  // An alert inside a run: the data before it, then the alert by name.
  {
    std::vector<char> wire;
    for (uint64_t seq = 0; seq < 4; ++seq) {
      auto rec = hand_seal(kSecret, seq, "x", 23);
      wire.insert(wire.end(), rec.begin(), rec.end());
    }
    auto alert = hand_seal(kSecret, 4, "\x02\x30", 21);
    wire.insert(wire.end(), alert.begin(), alert.end());
    for (uint64_t seq = 5; seq < 9; ++seq) {
      auto rec = hand_seal(kSecret, seq, "y", 23);
      wire.insert(wire.end(), rec.begin(), rec.end());
    }
    record_reader r(kSecret, &pool);
    std::vector<char> out;
    CHECK(feed_all(r, wire, out) == "the peer sent TLS alert 48 (unknown_ca)");
    CHECK(std::string(out.begin(), out.end()) == "xxxx");
  }
}

TEST_CASE("records: throughput (informational)") {
  constexpr std::size_t chunk = 256 * 1024, total = 64u << 20;
  auto data = random_bytes(chunk, 13);
  const unsigned hw = std::thread::hardware_concurrency();
  for (unsigned helpers : {0u, std::min(3u, hw > 1 ? hw - 1 : 0u)}) {
    troupe::fork_join_pool pool(helpers);
    record_writer w(kSecret, &pool);
    record_reader r(kSecret, &pool);
    std::vector<char> wire, out;
    wire.reserve(chunk + chunk / 16384 * 22 + 64);
    out.reserve(chunk);
    using clock = std::chrono::steady_clock;
    clock::duration seal_time{}, open_time{};
    bool same = true;
    for (std::size_t done = 0; done < total; done += chunk) {
      wire.clear();
      out.clear();
      auto t0 = clock::now();
      w.seal(data.data(), data.size(), wire);
      auto t1 = clock::now();
      REQUIRE(r.feed(wire.data(), wire.size(), out) == "");
      auto t2 = clock::now();
      seal_time += t1 - t0;
      open_time += t2 - t1;
      same = same && out == data;
    }
    CHECK(same);
    auto mbps = [&](clock::duration d) {
      return double(total) / 1e6 / std::chrono::duration<double>(d).count();
    };
    MESSAGE("TLS_AES_128_GCM_SHA256 records, 64 MB in 256 KiB calls, "
            << pool.lanes() << " lane(s): seal " << mbps(seal_time) << " MB/s, open "
            << mbps(open_time) << " MB/s, seal+open " << mbps(seal_time + open_time) << " MB/s");
  }
}
