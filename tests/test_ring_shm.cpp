// ring_shm: the shared ring of a link between two processes of one host
// (runtime/ring_shm.hpp). Both ends are mappings in this process; a third
// mapping of the memfd plays the hostile peer.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "devices/device.hpp"
#include "runtime/ring_shm.hpp"

using namespace troupe;

namespace {

constexpr std::size_t kCapacity = 4096;

// The writer's ring (made here) and the reader's (adopted from a copy of
// its memfd, as the peer adopts the one it is sent).
struct ring_pair {
  std::shared_ptr<ring_shm> writer = ring_shm::create(kCapacity);
  std::shared_ptr<ring_shm> reader = ring_shm::adopt(::dup(writer->memfd()), kCapacity);
};

// A raw read-write mapping of `shm`'s memfd: what a hostile peer holds.
struct raw_mapping {
  explicit raw_mapping(const ring_shm& shm) {
    bytes = ring_shm::data_offset + shm.capacity();
    p = static_cast<char*>(
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm.memfd(), 0));
    REQUIRE(p != MAP_FAILED);
  }
  ~raw_mapping() { ::munmap(p, bytes); }
  void put(std::size_t offset, uint64_t v) { std::memcpy(p + offset, &v, sizeof(v)); }
  char* p = nullptr;
  std::size_t bytes = 0;
};

// Reads all that is readable, in pieces, into a string.
std::string read_all(ring_shm& r) {
  std::string out;
  for (;;) {
    auto [data, n] = r.readable(4);
    if (n == 0) return out;
    out.append(data, n);
    r.consume(n);
  }
}

}  // namespace

TEST_CASE("ring_shm: bytes come out as they went in, across the wrap, and never overrun") {
  ring_pair ring;
  std::string sent, got;
  for (int round = 0; round < 10; ++round) {
    std::string chunk(3000, '\0');
    for (std::size_t i = 0; i < chunk.size(); ++i)
      chunk[i] = static_cast<char>('a' + (round * 7 + i) % 26);
    CHECK(ring.writer->write(chunk.data(), chunk.size()) == chunk.size());
    // A full ring takes only what fits.
    CHECK(ring.writer->write(chunk.data(), chunk.size()) == kCapacity - chunk.size());
    sent += chunk + chunk.substr(0, kCapacity - chunk.size());
    CHECK(ring.writer->write("x", 1) == 0);
    got += read_all(*ring.reader);
  }
  CHECK(got == sent);
}

TEST_CASE("ring_shm: the doorbell flags are owed once per sleep") {
  ring_pair ring;
  CHECK_FALSE(ring.writer->reader_owed_doorbell());
  ring.reader->reader_sleeps();
  CHECK(ring.writer->reader_owed_doorbell());
  CHECK_FALSE(ring.writer->reader_owed_doorbell());
  ring.writer->writer_sleeps();
  CHECK(ring.reader->writer_owed_doorbell());
  ring.writer->writer_sleeps();
  ring.writer->writer_wakes();
  CHECK_FALSE(ring.reader->writer_owed_doorbell());
}

TEST_CASE("ring_shm: a memfd that is not sealed, or not of the size announced, is refused") {
  const int plain = ::memfd_create("not-sealed", MFD_CLOEXEC);
  REQUIRE(plain >= 0);
  REQUIRE(::ftruncate(plain, ring_shm::data_offset + kCapacity) == 0);
  CHECK_THROWS_WITH_AS(ring_shm::adopt(plain, kCapacity), doctest::Contains("not a sealed memfd"),
                       device_error);
  auto made = ring_shm::create(kCapacity);
  CHECK_THROWS_WITH_AS(ring_shm::adopt(::dup(made->memfd()), 2 * kCapacity),
                       doctest::Contains("not of the size it announces"), device_error);
  CHECK_THROWS_WITH_AS(ring_shm::adopt(::dup(made->memfd()), 1000),
                       doctest::Contains("announces 1000 bytes"), device_error);
  // The seals hold: the peer cannot shrink it under our mapping.
  CHECK(::ftruncate(made->memfd(), 0) != 0);
}

TEST_CASE("ring_shm: a hostile peer's counters fail the link instead of moving our offsets") {
  SUBCASE("a write position past the capacity") {
    ring_pair ring;
    raw_mapping hostile(*ring.writer);
    hostile.put(ring_shm::head_offset, kCapacity + 4);
    CHECK_THROWS_AS(ring.reader->readable(4), std::runtime_error);
  }
  SUBCASE("a write position that goes back") {
    ring_pair ring;
    raw_mapping hostile(*ring.writer);
    REQUIRE(ring.writer->write("abcdefgh", 8) == 8);
    CHECK(ring.reader->readable(4).second == 8);
    hostile.put(ring_shm::head_offset, 4);
    CHECK_THROWS_AS(ring.reader->readable(4), std::runtime_error);
  }
  SUBCASE("a read position ahead of what was written, or going back") {
    ring_pair ring;
    raw_mapping hostile(*ring.writer);
    hostile.put(ring_shm::tail_offset, 1);
    CHECK_THROWS_AS(ring.writer->write("abcd", 4), std::runtime_error);
    ring_pair again;
    raw_mapping hostile2(*again.writer);
    REQUIRE(again.writer->write("abcdefgh", 8) == 8);
    hostile2.put(ring_shm::tail_offset, 8);
    CHECK(again.writer->write("ijkl", 4) == 4);
    hostile2.put(ring_shm::tail_offset, 4);
    CHECK_THROWS_AS(again.writer->write("mnop", 4), std::runtime_error);
  }
  SUBCASE("garbage in the data is only data") {
    ring_pair ring;
    raw_mapping hostile(*ring.writer);
    REQUIRE(ring.writer->write("abcd", 4) == 4);
    std::memset(hostile.p + ring_shm::data_offset, 0xff, kCapacity);
    auto [data, n] = ring.reader->readable(4);
    REQUIRE(n == 4);
    CHECK(static_cast<unsigned char>(data[0]) == 0xff);
  }
}
