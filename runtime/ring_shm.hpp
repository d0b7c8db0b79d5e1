#pragma once
// ring_shm: one direction of a process ring's link (runtime/process_ring.hpp)
// between two processes of one host, as a ring of bytes in shared memory
// (strategy.reducer.same_host "shm"), the way MPI and NCCL move
// data between ranks of one node: the sender copies a chunk in, the receiver
// combines it into its buffer straight from the mapping, one copy in all
// where a socket makes two and a system call per chunk.
//
// Set-up (runtime/ring_links.cpp): the link is first a Unix socket admitted
// as for same_host "unix" (the peer runs under our uid, SO_PEERCRED, and
// proves the link key). Only then does the listening end (the receiver)
// create the mapping: an anonymous memfd, sealed against shrinking, growing
// and further seals, passed to the connected end over that socket with
// SCM_RIGHTS. It never has a name: no file in /dev/shm another user could
// open, no descriptor in any other process. The socket stays: it carries
// the doorbells (one byte: "there is data" / "there is room" for a peer
// that went to sleep) and tells each end when the other closes or dies.
//
// Protocol: two monotonic byte counters on cache lines of their own, head
// (bytes written, only the writer stores it) and tail (bytes read, only the
// reader stores it); data lie at counter % capacity. The writer copies into
// the free part and publishes head; the reader combines what lies between
// tail and head and publishes tail. A side that finds nothing to do spins a
// short while, then raises its "asleep" flag, looks once more, and waits in
// poll() on the socket; the other side, after publishing, clears a raised
// flag and sends a doorbell byte (the flag is stored and the counter
// loaded sequentially consistent on one side, the counter stored and the
// flag loaded so on the other, so a doorbell is never lost).
//
// Threat model. The mapping is shared with one process only: the peer that
// passed the uid check and the key's proof on the socket it arrives on. A
// same-uid process can already read our memory (ptrace, /proc/pid/mem), so
// nothing here hides data from it; what matters is that a buggy or hostile
// peer cannot make us crash or write outside our buffers. So each side keeps
// its own counter privately and only stores it into the mapping; the
// other's counter is read once per look and checked (it only grows, and
// head - tail never exceeds the capacity) before any offset is derived
// from it, and a bad value fails the collective (device_error naming the
// link). The seals stop the peer from shrinking the memfd under our
// mapping (which would raise SIGBUS), and an adopted memfd is checked for
// them and for its size before it is mapped. The data are floats: garbage
// in them gives a wrong sum, never a wrong address. A peer that stops
// moving its counter is a silent peer: the collective's timeout ends it.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace troupe {

class ring_shm {
 public:
  // Data bytes of a link's ring: the 1.08 MB all-reduce of two processes
  // moves 0.54 MB each way a step, so a step is never held up for room.
  static constexpr std::size_t default_capacity = 2u << 20;

  // A fresh mapping with `capacity` data bytes (a multiple of 4096), its
  // memfd sealed; throws device_error naming the call that failed.
  static std::shared_ptr<ring_shm> create(std::size_t capacity = default_capacity);
  // Maps the memfd a peer sent (taken over: closed here before returning),
  // after checking its seals and that it holds `capacity` data bytes;
  // throws device_error saying what was wrong.
  static std::shared_ptr<ring_shm> adopt(int memfd, std::size_t capacity);
  ~ring_shm();
  ring_shm(const ring_shm&) = delete;
  ring_shm& operator=(const ring_shm&) = delete;

  std::size_t capacity() const { return capacity_; }
  // The memfd of a mapping made by create() (-1 after close_memfd()).
  int memfd() const { return memfd_; }
  void close_memfd();

  // --- the writer's side. Every call throws ring_detail::link_broken when
  // the peer's counter is out of range.
  // Copies as much of the `n` bytes at `data` as there is room for and
  // publishes them; the bytes taken (0: the ring is full).
  std::size_t write(const char* data, std::size_t n);
  // Whether the reader went to sleep (cleared here): it is owed a doorbell.
  bool reader_owed_doorbell();
  // Raises the writer's "asleep" flag (before it waits in poll()).
  void writer_sleeps();
  void writer_wakes();

  // --- the reader's side.
  // The bytes that lie ready in one piece, in whole `unit`s (which divide
  // the capacity; `unit` is what the reader always consumes by).
  std::pair<const char*, std::size_t> readable(std::size_t unit);
  // Hands `n` bytes of readable() back to the writer.
  void consume(std::size_t n);
  bool writer_owed_doorbell();
  void reader_sleeps();
  void reader_wakes();

  struct control;  // the counters' cache lines at the start of the mapping
  // Where the counters (uint64) and the data lie in the mapping, for tests
  // that play a hostile peer.
  static constexpr std::size_t head_offset = 0, tail_offset = 128, data_offset = 4096;

 private:
  ring_shm(int memfd, std::size_t capacity, bool fresh);

  int memfd_ = -1;
  std::size_t capacity_ = 0;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  control* ctl_ = nullptr;
  char* data_ = nullptr;
  // Private: what this side wrote or read, and the other's counter as last
  // seen (it may only grow).
  uint64_t head_ = 0, tail_ = 0, seen_ = 0;
};

}  // namespace troupe
