#pragma once
// tensor: the value type every actor exchanges. The buffer is refcounted and
// shared, so moving or copying a tensor between actors in one process never
// copies the data; clone() is the only deep copy. Serialization (for messages
// crossing a process boundary) writes the buffer as one raw block.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

enum class dtype : uint8_t { f32 = 0, i32 = 1, i64 = 2 };

std::size_t dtype_size(dtype t);
const char* dtype_name(dtype t);
// Parses "float32", "int32", "int64"; throws std::invalid_argument otherwise.
dtype parse_dtype(const std::string& s);

template <class T>
constexpr dtype dtype_of();
template <>
constexpr dtype dtype_of<float>() {
  return dtype::f32;
}
template <>
constexpr dtype dtype_of<int32_t>() {
  return dtype::i32;
}
template <>
constexpr dtype dtype_of<int64_t>() {
  return dtype::i64;
}

using shape_t = std::vector<int64_t>;

std::string shape_string(const shape_t& s);
int64_t shape_numel(const shape_t& s);

class tensor {
 public:
  tensor() = default;
  // A zero-filled tensor of the given shape.
  explicit tensor(shape_t shape, dtype t = dtype::f32);
  // A tensor of the given shape whose contents are NOT initialized: for
  // buffers overwritten at once (deserializers, copies).
  static tensor uninitialized(shape_t shape, dtype t = dtype::f32);

  // A tensor over memory it does not own (a memory-mapped file): `owner`
  // points at the first element and keeps the memory alive for as long as
  // any copy of the tensor (or of its buffer) exists, so the memory cannot be
  // released under a reader; build it with shared_ptr's aliasing constructor.
  // The tensor is as writable as any other: map private copy-on-write memory,
  // not read-only pages. Throws std::invalid_argument when `owner` is null
  // for a non-empty shape or is not 64-byte aligned (the kernels' vector
  // loads assume every buffer is).
  static tensor wrap(shape_t shape, dtype t, std::shared_ptr<void> owner);

  template <class T>
  static tensor from(shape_t shape, const std::vector<T>& values) {
    tensor r(std::move(shape), dtype_of<T>());
    if (static_cast<std::size_t>(r.numel()) != values.size())
      throw std::invalid_argument("tensor::from: " + std::to_string(values.size()) +
                                  " values for shape " + shape_string(r.shape()));
    std::copy(values.begin(), values.end(), r.data<T>());
    return r;
  }

  const shape_t& shape() const noexcept { return shape_; }
  dtype type() const noexcept { return type_; }
  int64_t numel() const noexcept { return numel_; }
  std::size_t nbytes() const noexcept {
    return static_cast<std::size_t>(numel_) * dtype_size(type_);
  }
  bool empty() const noexcept { return numel_ == 0; }
  int64_t dim(std::size_t i) const { return shape_.at(i); }
  std::size_t rank() const noexcept { return shape_.size(); }

  void* raw() noexcept { return buf_.get(); }
  const void* raw() const noexcept { return buf_.get(); }

  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return static_cast<T*>(buf_.get());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(buf_.get());
  }
  template <class T>
  std::span<T> span() {
    return {data<T>(), static_cast<std::size_t>(numel_)};
  }
  template <class T>
  std::span<const T> span() const {
    return {data<T>(), static_cast<std::size_t>(numel_)};
  }

  float* f32() { return data<float>(); }
  const float* f32() const { return data<float>(); }

  // Deep copy (new buffer).
  tensor clone() const;
  // Same buffer, new shape with the same number of elements.
  tensor reshaped(shape_t shape) const;
  // True when both tensors share one buffer (zero-copy check for tests).
  bool shares_buffer_with(const tensor& other) const noexcept { return buf_ && buf_ == other.buf_; }
  long use_count() const noexcept { return buf_.use_count(); }

  void fill(float v);

  // Used by the deserializer: reallocate for a given shape and type.
  void reset(shape_t shape, dtype t);

 private:
  void check_type(dtype t) const {
    if (t != type_)
      throw std::logic_error(std::string("tensor: accessed as ") + dtype_name(t) + ", holds " +
                             dtype_name(type_));
  }
  shape_t shape_;
  dtype type_ = dtype::f32;
  int64_t numel_ = 0;
  std::shared_ptr<void> buf_;
};

bool operator==(const tensor& a, const tensor& b);  // same shape, type and bytes

// A variable or gradient with its name: the unit checkpoints and reducers see.
struct named_tensor {
  std::string name;
  tensor value;
};

}  // namespace troupe
