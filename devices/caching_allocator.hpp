#pragma once
// caching_allocator: device memory without a raw allocation per step. Blocks
// are rounded up to a size class and, when freed, kept in a free list for
// that class; the next request of the class reuses one. A training step asks
// for the same sizes every time, so once warm it allocates nothing
// (cudaMalloc synchronises the whole device; PyTorch's CUDA allocator works
// the same way). A failed raw allocation releases the cache and retries once
// before it throws.
//
// The raw functions are the device's (cudaMalloc/cudaFree, cudaHostAlloc for
// pinned staging, aligned host memory for the CPU devices), so the
// bookkeeping is the same code everywhere and tested on the CPU.
// Thread-safe: a buffer may be released on another thread than it was taken.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace troupe {

class caching_allocator {
 public:
  using raw_alloc = std::function<void*(std::size_t)>;  // null on failure
  using raw_free = std::function<void(void*)>;

  struct stats {
    uint64_t requests = 0;         // allocate() calls
    uint64_t cache_hits = 0;       // served from the free lists
    uint64_t raw_allocations = 0;  // calls of the raw allocator
    uint64_t raw_frees = 0;
    std::size_t bytes_in_use = 0;  // handed out, by size class
    std::size_t bytes_cached = 0;  // in the free lists
    std::size_t peak_bytes_in_use = 0;
  };

  // `name` appears in errors ("cuda:0: out of memory allocating 1.5 MiB ...").
  caching_allocator(std::string name, raw_alloc alloc, raw_free free);
  ~caching_allocator();  // frees every cached block (blocks in use are the owners' to return)
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;

  // A block of at least `bytes` (0 gives a valid, distinct block of the
  // smallest class). Throws std::runtime_error naming the allocator and size
  // when the raw allocator fails even after the cache is released.
  void* allocate(std::size_t bytes);
  // Returns a block from allocate() to its free list; any other pointer
  // throws std::logic_error.
  void deallocate(void* p);
  // Gives every cached block back to the raw allocator.
  void release_cached();
  stats statistics() const;

  // The size class of a request: multiples of 512 bytes up to 1 MiB, then
  // multiples of 1/8 of the next power of two (at most 12.5% waste).
  static std::size_t size_class(std::size_t bytes);

 private:
  void release_cached_locked();
  std::string name_;
  raw_alloc raw_alloc_;
  raw_free raw_free_;
  mutable std::mutex mtx_;
  std::map<std::size_t, std::vector<void*>> cached_;  // size class -> free blocks
  std::unordered_map<void*, std::size_t> in_use_;     // block -> size class
  stats stats_;
};

}  // namespace troupe
