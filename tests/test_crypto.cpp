// The crypto leaf (crypto/crypto.hpp) against the published test vectors:
// FIPS 180-4 (SHA-256), RFC 4231 (HMAC-SHA256), RFC 5869 (HKDF-SHA256),
// RFC 8448 (TLS 1.3's HKDF-Expand-Label).
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "crypto/crypto.hpp"

using namespace troupe::crypto;

namespace {

std::string unhex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string range(int from, int to) {
  std::string out;
  for (int i = from; i <= to; ++i) out.push_back(static_cast<char>(i));
  return out;
}

}  // namespace

TEST_CASE("crypto: SHA-256, FIPS 180-4 examples, one-shot and streamed") {
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // 55, 56 and 64 bytes: the padding's edge cases.
  CHECK(to_hex(sha256(std::string(55, 'a'))) ==
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(to_hex(sha256(std::string(56, 'a'))) ==
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(to_hex(sha256(std::string(64, 'a'))) ==
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");

  // Streamed: every cut of a two-block message gives the one-shot digest.
  const std::string msg = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq" + range(0, 80);
  sha256_stream stream;
  for (std::size_t cut = 0; cut <= msg.size(); ++cut) {
    stream.update(std::string_view(msg).substr(0, cut));
    stream.update(std::string_view(msg).substr(cut));
    REQUIRE(stream.finish() == sha256(msg));  // finish starts the stream afresh
  }
  for (int i = 0; i < 1000; ++i) stream.update(std::string(1000, 'a'));
  CHECK(to_hex(stream.finish()) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("crypto: HMAC-SHA256, RFC 4231 test cases") {
  // 1, 2, 3, 4, 6 (a key longer than the block), 7 (and a long message).
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(to_hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  CHECK(to_hex(hmac_sha256(range(1, 25), std::string(50, '\xcd'))) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(to_hex(hmac_sha256(
            std::string(131, '\xaa'),
            "This is a test using a larger than block-size key and a larger than block-size "
            "data. The key needs to be hashed before being used by the HMAC algorithm.")) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // An empty key is a block of zeros (RFC 2104), not an error.
  CHECK(hmac_sha256("", "m") == hmac_sha256(std::string(64, '\0'), "m"));
}

TEST_CASE("crypto: HKDF-SHA256, RFC 5869 test cases 1 to 3") {
  const std::string ikm1(22, '\x0b');
  const std::string prk1 = hkdf_extract(range(0x00, 0x0c), ikm1);
  CHECK(to_hex(prk1) == "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5");
  CHECK(to_hex(hkdf_expand(prk1, range(0xf0, 0xf9), 42)) ==
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  CHECK(to_hex(hkdf(range(0x00, 0x0c), ikm1, range(0xf0, 0xf9), 42)) ==
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  // 2: longer inputs and outputs.
  const std::string prk2 = hkdf_extract(range(0x60, 0xaf), range(0x00, 0x4f));
  CHECK(to_hex(prk2) == "06a6b88c5853361a06104c9ceb35b45cef760014904671014a193f40c15fc244");
  CHECK(to_hex(hkdf_expand(prk2, range(0xb0, 0xff), 82)) ==
        "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41"
        "c65e590e09da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87");
  // 3: no salt (HashLen zeros), no info.
  CHECK(to_hex(hkdf_extract("", ikm1)) ==
        "19ef24a32c717b167f33a91d6f648bdf96596776afdb6377ac434c1c293ccb04");
  CHECK(hkdf_extract("", ikm1) == hkdf_extract(std::string(32, '\0'), ikm1));
  CHECK(to_hex(hkdf("", ikm1, "", 42)) ==
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
  // The limits of Expand: 255 blocks, a whole PRK.
  CHECK(hkdf_expand(prk1, "", 255 * 32).size() == 8160);
  CHECK_THROWS_AS(hkdf_expand(prk1, "", 255 * 32 + 1), std::invalid_argument);
  CHECK_THROWS_AS(hkdf_expand(prk1, "", 0), std::invalid_argument);
  CHECK_THROWS_AS(hkdf_expand(prk1.substr(0, 31), "", 16), std::invalid_argument);
}

TEST_CASE("crypto: HKDF-Expand-Label, RFC 8448's Simple 1-RTT Handshake") {
  // The early secret of a handshake without a PSK, and Derive-Secret(.,
  // "derived", "") = HKDF-Expand-Label(., "derived", SHA-256(""), 32).
  const std::string early = hkdf_extract("", std::string(32, '\0'));
  CHECK(to_hex(early) == "33ad0a1c607ec03b09e6cd9893680ce210adf300aa1f2660e1b22e10f170f92a");
  CHECK(to_hex(hkdf_expand_label(early, "derived", as_string(sha256("")), 32)) ==
        "6f2615a108c702c5678f54fc9dbab69716c076189c48250cebeac3576c3611ba");
  // The server's handshake write key and iv from its handshake traffic secret.
  const std::string server_hs =
      unhex("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38");
  CHECK(to_hex(hkdf_expand_label(server_hs, "key", "", 16)) == "3fce516009c21727d0f2e4e86ee403bc");
  CHECK(to_hex(hkdf_expand_label(server_hs, "iv", "", 12)) == "5d313eb2671276ee13000b30");
  CHECK_THROWS_AS(hkdf_expand_label(server_hs, std::string(250, 'l'), "", 16),
                  std::invalid_argument);
}

TEST_CASE("crypto: constant-time comparison, random bytes, wiping, hex") {
  CHECK(constant_time_equal("", ""));
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "abcd"));
  CHECK_FALSE(constant_time_equal("abc", ""));
  CHECK_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
  CHECK_FALSE(constant_time_equal(std::string("\0", 1), ""));

  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) {
    auto r = random_bytes(32);
    REQUIRE(r.size() == 32);
    seen.insert(r);
  }
  CHECK(seen.size() == 64);  // 64 draws of 256 bits: a repeat means no randomness
  // Every byte value turns up in 64 KiB of random bytes (a stuck byte would not).
  const auto many = random_bytes(1 << 16);
  std::set<unsigned char> values(many.begin(), many.end());
  CHECK(values.size() == 256);
  CHECK(random_bytes(0).empty());

  std::string key = "a key held in memory";
  char* p = key.data();
  const std::size_t n = key.size();
  cleanse(key);
  CHECK(key.empty());
  CHECK(std::string(p, n) == std::string(n, '\0'));  // the buffer itself is wiped

  CHECK(to_hex(std::string("\x00\x7f\x80\xff", 4)) == "007f80ff");
}
