#pragma once
// device_context: what a replica needs from the device it computes on, used
// only from that device's thread (devices/device.hpp: cpu_device runs the
// tasks). Memory comes from a caching allocator; copies between host and
// device are explicit; compute is a backend (kernels/backend.hpp) whose work
// is ordered on the device's compute stream; uploads may run ahead on a copy
// stream, ordered by events.
//
// Three implementations:
//   cpu:N   host memory, shared with the host: tensors are used in place and
//           no copy is ever made (shares_host_memory());
//   sim:N   a CPU device that behaves like a discrete accelerator: its own
//           memory, every transfer explicit and counted, uploads run on a
//           separate copy thread and are ordered by events. The whole GPU
//           orchestration (staging, residency, events, device collectives)
//           runs on it in the CPU test suite, bit-identical to cpu:N;
//   cuda:N  devices/cuda_context.cpp: a compute and a copy stream, cuBLAS,
//           pinned staging buffers.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "devices/caching_allocator.hpp"
#include "devices/device.hpp"
#include "kernels/backend.hpp"

namespace troupe {

// Bytes in one device's memory, given back to its allocator when the last
// copy of the handle goes (on any thread).
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(std::shared_ptr<void> p, std::size_t bytes) : p_(std::move(p)), bytes_(bytes) {}
  void* data() const noexcept { return p_.get(); }
  float* f32() const noexcept { return static_cast<float*>(p_.get()); }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(p_.get());
  }
  std::size_t bytes() const noexcept { return bytes_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  std::shared_ptr<void> p_;
  std::size_t bytes_ = 0;
};

// A point in a device's copy stream: later compute waits for it with
// device_context::wait().
class device_event {
 public:
  virtual ~device_event() = default;
  virtual bool done() const = 0;  // the copies before it are complete
};

// A device's compute recorded once and launched again and again: a CUDA graph
// on cuda:N, the recorded backend calls on sim:N. A launch does the same work
// on the same buffers, reading what they hold at that time; it is ordered
// with the rest of the device's compute like any other call.
class device_graph {
 public:
  virtual ~device_graph() = default;
  virtual void launch() = 0;
  virtual std::size_t operations() const = 0;  // kernels / calls in one launch
};

struct transfer_stats {
  uint64_t uploads = 0, downloads = 0;  // calls
  uint64_t bytes_up = 0, bytes_down = 0;
};

class device_context {
 public:
  virtual ~device_context() = default;
  virtual const device_spec& spec() const = 0;
  // cpu:N: device memory is host memory, tensors are used in place.
  virtual bool shares_host_memory() const = 0;

  virtual device_buffer allocate(std::size_t bytes) = 0;
  // Host -> device, ordered before any compute issued after it; `src` may be
  // reused when it returns (a discrete device stages it in pinned memory).
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes) = 0;
  // Device -> host after the compute issued before it; returns when `dst`
  // holds the bytes.
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  // Host -> device on the copy stream, overlapping the compute stream's work
  // (a batch uploaded while the previous one computes). `src` is staged
  // before this returns. Compute that reads `dst` must wait(event) first.
  virtual std::shared_ptr<device_event> upload_async(void* dst, const void* src,
                                                     std::size_t bytes) = 0;
  // Compute issued after this runs after the event's copies.
  virtual void wait(const std::shared_ptr<device_event>& e) = 0;
  // Returns when everything issued is done; throws device_error naming the
  // device and the failure (an asynchronous kernel error surfaces here).
  virtual void synchronize() = 0;
  virtual kernels::backend& ops() = 0;

  // Records the compute that `body` issues through ops() as a graph, without
  // running it (body's host code runs once, now). Inside body nothing may
  // cross between host and device (copies, uploads, synchronize throw
  // device_error: a graph would replay a stale staging buffer) and every
  // buffer it uses must outlive the graph. Null where the device has no
  // graphs (cpu:N); throws device_error when the capture fails, naming why.
  virtual std::unique_ptr<device_graph> capture(const std::function<void()>& body) {
    (void)body;
    return nullptr;
  }

  // Bytes free in the device's memory, where the device can tell (cuda:N).
  virtual std::optional<std::size_t> free_memory() const { return std::nullopt; }
  virtual caching_allocator::stats memory_stats() const = 0;
  virtual transfer_stats transfers() const = 0;
};

// The context for a device; call on the thread that runs the device's tasks
// (CUDA binds the device to the calling thread). Throws device_error when the
// device cannot be used here (check_device_available's message).
std::shared_ptr<device_context> make_device_context(const device_spec& d);
// The context of the discrete device (sim:N, cuda:N) a device thread is
// named after; null for cpu:N or a name that is no device (a thread's own
// label). Same thread rule and errors as make_device_context.
std::shared_ptr<device_context> discrete_device_context(const std::string& name);

// Starts what makes a device's first use slow (a CUDA context, its library
// handles and first calls; cuDNN's too when the model has `convolutions`) on
// a thread of its own, so that it overlaps the caller's work (loading the
// data); the returned thread is joined by the caller. Errors are left to the
// device's own creation to report.
std::thread prepare_devices(const std::vector<std::string>& devices, bool convolutions = false);
// Destroys the prepared contexts no device took (a job that failed before
// its replicas were built); call before the process's exit.
void release_prepared_devices();

// Typed helpers over a context.
template <class T>
device_buffer allocate_array(device_context& ctx, std::size_t n) {
  return ctx.allocate(n * sizeof(T));
}

}  // namespace troupe
