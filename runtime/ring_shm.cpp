// The shared-memory ring of a link between two processes of one host
// (runtime/ring_shm.hpp: the protocol and the threat model).
#include "runtime/ring_shm.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>

#include "devices/device.hpp"
#include "runtime/ring_detail.hpp"

namespace troupe {

using namespace ring_detail;

namespace {

constexpr std::size_t kPage = 4096;
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
// No larger ring is ever made or accepted (a peer's memfd is checked
// against the size it announced, which must lie in this range).
constexpr std::size_t kMaxCapacity = std::size_t{1} << 30;

using counter = std::atomic<uint64_t>;
using flag = std::atomic<uint32_t>;
static_assert(counter::is_always_lock_free && flag::is_always_lock_free,
              "the counters are shared between processes: lock-free atomics only");

}  // namespace

// Each counter and flag on a cache line of its own: the writer's stores do
// not evict the line the reader stores to.
struct ring_shm::control {
  alignas(64) counter head;  // bytes written; stored by the writer only
  alignas(64) flag reader_asleep;
  alignas(64) counter tail;  // bytes read; stored by the reader only
  alignas(64) flag writer_asleep;
};
static_assert(sizeof(ring_shm::control) <= kPage && kPage == ring_shm::data_offset);
static_assert(offsetof(ring_shm::control, head) == ring_shm::head_offset &&
              offsetof(ring_shm::control, tail) == ring_shm::tail_offset);

ring_shm::ring_shm(int memfd, std::size_t capacity, bool fresh)
    : memfd_(memfd), capacity_(capacity) {
  map_bytes_ = kPage + capacity;
  void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) {
    const std::string why = errno_text("mmap");
    ::close(memfd_);
    throw device_error("process ring: shared buffer: " + why);
  }
  map_ = p;
  // A fresh memfd is zeros, and so are the counters the creator places on
  // it; the peer that adopts it finds them there (a lock-free atomic is its
  // integer).
  ctl_ = fresh ? new (map_) control{} : reinterpret_cast<control*>(map_);
  data_ = static_cast<char*>(map_) + kPage;
}

ring_shm::~ring_shm() {
  if (map_) ::munmap(map_, map_bytes_);
  close_memfd();
}

void ring_shm::close_memfd() {
  if (memfd_ >= 0) ::close(memfd_);
  memfd_ = -1;
}

std::shared_ptr<ring_shm> ring_shm::create(std::size_t capacity) {
  if (capacity == 0 || capacity % kPage != 0 || capacity > kMaxCapacity)
    throw device_error("process ring: shared buffer of " + std::to_string(capacity) + " bytes");
  const int fd = ::memfd_create("troupe-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw device_error("process ring: shared buffer: " + errno_text("memfd_create"));
  if (::ftruncate(fd, static_cast<off_t>(kPage + capacity)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    const std::string why = errno_text("sealing the memfd");
    ::close(fd);
    throw device_error("process ring: shared buffer: " + why);
  }
  return std::shared_ptr<ring_shm>(new ring_shm(fd, capacity, true));
}

std::shared_ptr<ring_shm> ring_shm::adopt(int memfd, std::size_t capacity) {
  auto refuse = [&](const std::string& why) {
    ::close(memfd);
    throw device_error("process ring: the peer's shared buffer " + why);
  };
  if (capacity == 0 || capacity % kPage != 0 || capacity > kMaxCapacity)
    refuse("announces " + std::to_string(capacity) + " bytes");
  const int seals = ::fcntl(memfd, F_GET_SEALS);
  if (seals < 0 || (static_cast<unsigned>(seals) & kSeals) != kSeals)
    refuse("is not a sealed memfd");
  struct stat st {};
  if (::fstat(memfd, &st) != 0 || static_cast<uint64_t>(st.st_size) != kPage + capacity)
    refuse("is not of the size it announces");
  auto shm = std::shared_ptr<ring_shm>(new ring_shm(memfd, capacity, false));
  shm->close_memfd();  // the mapping stays
  return shm;
}

std::size_t ring_shm::write(const char* data, std::size_t n) {
  const uint64_t t = ctl_->tail.load(std::memory_order_seq_cst);
  if (t < seen_ || t > head_)
    throw link_broken("the peer's read position in the shared buffer is out of range");
  seen_ = t;
  n = std::min<uint64_t>(n, capacity_ - (head_ - t));
  if (n == 0) return 0;
  const std::size_t at = head_ % capacity_;
  const std::size_t first = std::min(n, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  std::memcpy(data_, data + first, n - first);
  head_ += n;
  ctl_->head.store(head_, std::memory_order_seq_cst);
  return n;
}

std::pair<const char*, std::size_t> ring_shm::readable(std::size_t unit) {
  const uint64_t h = ctl_->head.load(std::memory_order_seq_cst);
  if (h < seen_ || h - tail_ > capacity_)
    throw link_broken("the peer's write position in the shared buffer is out of range");
  seen_ = h;
  const std::size_t at = tail_ % capacity_;
  std::size_t n = std::min<uint64_t>(h - tail_, capacity_ - at);
  n -= n % unit;
  return {data_ + at, n};
}

void ring_shm::consume(std::size_t n) {
  tail_ += n;
  ctl_->tail.store(tail_, std::memory_order_seq_cst);
}

// The Dekker pair: the sleeper stores its flag, then loads the counter; the
// other stores the counter, then loads the flag (all sequentially
// consistent), so one of the two sees the other's store.
bool ring_shm::reader_owed_doorbell() {
  return ctl_->reader_asleep.load(std::memory_order_seq_cst) != 0 &&
         ctl_->reader_asleep.exchange(0) != 0;
}

bool ring_shm::writer_owed_doorbell() {
  return ctl_->writer_asleep.load(std::memory_order_seq_cst) != 0 &&
         ctl_->writer_asleep.exchange(0) != 0;
}

void ring_shm::writer_sleeps() {
  ctl_->writer_asleep.store(1, std::memory_order_seq_cst);
}

void ring_shm::writer_wakes() {
  ctl_->writer_asleep.store(0, std::memory_order_relaxed);
}

void ring_shm::reader_sleeps() {
  ctl_->reader_asleep.store(1, std::memory_order_seq_cst);
}

void ring_shm::reader_wakes() {
  ctl_->reader_asleep.store(0, std::memory_order_relaxed);
}

}  // namespace troupe
