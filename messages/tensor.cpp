#include "messages/tensor.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace troupe {

std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32:
      return 4;
    case dtype::i32:
      return 4;
    case dtype::i64:
      return 8;
  }
  return 0;
}

const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::f32:
      return "float32";
    case dtype::i32:
      return "int32";
    case dtype::i64:
      return "int64";
  }
  return "unknown";
}

dtype parse_dtype(const std::string& s) {
  if (s == "float32") return dtype::f32;
  if (s == "int32") return dtype::i32;
  if (s == "int64") return dtype::i64;
  throw std::invalid_argument("unknown dtype '" + s + "' (expected float32, int32 or int64)");
}

std::string shape_string(const shape_t& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

int64_t shape_numel(const shape_t& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_string(s));
    n *= d;
  }
  return n;
}

namespace {

// Large buffers are recycled instead of returned to the allocator: batches and
// gradients of the same sizes come and go every step, and a fresh large
// allocation is a fresh mmap whose pages fault in one by one (measured: ~6% of
// a mirrored training step in page faults before this pool).
class buffer_pool {
 public:
  static constexpr std::size_t min_pooled = 64 << 10;
  static constexpr std::size_t max_per_size = 16;
  static constexpr std::size_t max_total = std::size_t{512} << 20;

  void* take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> g(mtx_);
      auto i = free_.find(bytes);
      if (i != free_.end() && !i->second.empty()) {
        void* p = i->second.back();
        i->second.pop_back();
        total_ -= bytes;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    return p;
  }

  void give(void* p, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> g(mtx_);
      auto& list = free_[bytes];
      if (list.size() < max_per_size && total_ + bytes <= max_total) {
        list.push_back(p);
        total_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  ~buffer_pool() {
    for (auto& [_, list] : free_)
      for (void* p : list) std::free(p);
  }

 private:
  std::mutex mtx_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t total_ = 0;
};

buffer_pool& pool() {
  // Never destroyed: tensors may outlive static destruction order.
  static auto* p = new buffer_pool();
  return *p;
}

// 64-byte alignment keeps BLAS and vector loads on their fast path.
std::shared_ptr<void> allocate(std::size_t bytes, bool zero = true) {
  if (bytes == 0) return {};
  std::size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded < buffer_pool::min_pooled) {
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    if (zero) std::memset(p, 0, rounded);
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  void* p = pool().take(rounded);
  if (zero) std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [rounded](void* q) { pool().give(q, rounded); });
}
}  // namespace

tensor::tensor(shape_t shape, dtype t) {
  reset(std::move(shape), t);
}

tensor tensor::uninitialized(shape_t shape, dtype t) {
  tensor r;
  r.numel_ = shape_numel(shape);
  r.shape_ = std::move(shape);
  r.type_ = t;
  r.buf_ = allocate(r.nbytes(), false);
  return r;
}

tensor tensor::wrap(shape_t shape, dtype t, std::shared_ptr<void> owner) {
  tensor r;
  r.numel_ = shape_numel(shape);
  r.shape_ = std::move(shape);
  r.type_ = t;
  if (r.nbytes() == 0) return r;
  if (!owner) throw std::invalid_argument("tensor::wrap: no memory for " + shape_string(r.shape_));
  if (reinterpret_cast<std::uintptr_t>(owner.get()) % 64 != 0)
    throw std::invalid_argument("tensor::wrap: memory is not 64-byte aligned");
  r.buf_ = std::move(owner);
  return r;
}

void tensor::reset(shape_t shape, dtype t) {
  numel_ = shape_numel(shape);
  shape_ = std::move(shape);
  type_ = t;
  buf_ = allocate(nbytes());
}

tensor tensor::clone() const {
  tensor r = uninitialized(shape_, type_);
  if (nbytes()) std::memcpy(r.raw(), raw(), nbytes());
  return r;
}

tensor tensor::reshaped(shape_t shape) const {
  if (shape_numel(shape) != numel_)
    throw std::invalid_argument("tensor::reshaped: " + shape_string(shape_) + " to " +
                                shape_string(shape));
  tensor r = *this;
  r.shape_ = std::move(shape);
  return r;
}

void tensor::fill(float v) {
  auto* p = f32();
  for (int64_t i = 0; i < numel_; ++i) p[i] = v;
}

bool operator==(const tensor& a, const tensor& b) {
  if (a.shape() != b.shape() || a.type() != b.type()) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace troupe
