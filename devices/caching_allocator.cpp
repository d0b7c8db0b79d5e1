#include "devices/caching_allocator.hpp"

#include <bit>
#include <cstdio>
#include <stdexcept>

namespace troupe {

namespace {
std::string mib(std::size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}
}  // namespace

caching_allocator::caching_allocator(std::string name, raw_alloc alloc, raw_free free)
    : name_(std::move(name)), raw_alloc_(std::move(alloc)), raw_free_(std::move(free)) {}

caching_allocator::~caching_allocator() {
  std::lock_guard lock(mtx_);
  release_cached_locked();
}

std::size_t caching_allocator::size_class(std::size_t bytes) {
  constexpr std::size_t small = 512, large = std::size_t{1} << 20;
  if (bytes <= small) return small;
  if (bytes <= large) return (bytes + small - 1) / small * small;
  const std::size_t step = std::bit_ceil(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

void* caching_allocator::allocate(std::size_t bytes) {
  if (bytes > (std::size_t{1} << 48))
    throw std::runtime_error(name_ + ": refusing to allocate " + std::to_string(bytes) + " bytes");
  const std::size_t cls = size_class(bytes);
  std::lock_guard lock(mtx_);
  ++stats_.requests;
  void* p = nullptr;
  auto it = cached_.find(cls);
  if (it != cached_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= cls;
    ++stats_.cache_hits;
  } else {
    p = raw_alloc_(cls);
    if (!p && stats_.bytes_cached > 0) {  // the cache may hold what the device needs
      release_cached_locked();
      p = raw_alloc_(cls);
    }
    if (!p)
      throw std::runtime_error(name_ + ": out of memory allocating " + mib(cls) + " (" +
                               mib(stats_.bytes_in_use) + " in use)");
    ++stats_.raw_allocations;
  }
  in_use_.emplace(p, cls);
  stats_.bytes_in_use += cls;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use)
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  return p;
}

void caching_allocator::deallocate(void* p) {
  if (!p) return;
  std::lock_guard lock(mtx_);
  auto it = in_use_.find(p);
  if (it == in_use_.end())
    throw std::logic_error(name_ + ": deallocate of a pointer this allocator did not hand out");
  const std::size_t cls = it->second;
  in_use_.erase(it);
  stats_.bytes_in_use -= cls;
  stats_.bytes_cached += cls;
  cached_[cls].push_back(p);
}

void caching_allocator::release_cached() {
  std::lock_guard lock(mtx_);
  release_cached_locked();
}

void caching_allocator::release_cached_locked() {
  for (auto& [cls, blocks] : cached_)
    for (void* p : blocks) {
      raw_free_(p);
      ++stats_.raw_frees;
    }
  cached_.clear();
  stats_.bytes_cached = 0;
}

caching_allocator::stats caching_allocator::statistics() const {
  std::lock_guard lock(mtx_);
  return stats_;
}

}  // namespace troupe
