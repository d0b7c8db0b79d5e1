// The cuda:N device context: a compute and a copy stream, the CUDA backend
// (cuBLAS + kernels/cuda_kernels.cu) on the compute stream, a caching
// allocator over cudaMalloc, and pinned staging buffers (a caching allocator
// over cudaHostAlloc) for every transfer between host and device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "devices/cuda_context.hpp"
#include "kernels/cuda_backend.hpp"

namespace troupe {
namespace {

std::string cuda_message(const device_spec& d, const char* what, cudaError_t e) {
  return d.str() + ": " + what + ": " + cudaGetErrorString(e);
}

void check(cudaError_t e, const device_spec& d, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // a non-sticky error must not be reported again by a later launch
  throw device_error(cuda_message(d, what, e));
}

// For teardown paths, which must not throw: the error is dropped (a sticky
// error has already been, or will be, reported by synchronize).
void ignore(cudaError_t e) {
  if (e != cudaSuccess) (void)cudaGetLastError();
}

// Makes `device` current for a scope and restores the thread's device after:
// destructors and deleters may run on another device's thread (whoever drops
// the last reference), which must keep its own device current.
class device_guard {
 public:
  explicit device_guard(int device) : device_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device_) ignore(cudaSetDevice(device_));
  }
  ~device_guard() {
    if (prev_ >= 0 && prev_ != device_) ignore(cudaSetDevice(prev_));
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

// For the allocators' raw functions: true on success, false when out of
// memory (the caching allocator then frees its cache and retries, or reports
// it), and any other error (a sticky one from an earlier fault) thrown as
// itself rather than reported as "out of memory".
bool raw_result(cudaError_t e, const device_spec& d, const char* what) {
  if (e == cudaSuccess) return true;
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky
    return false;
  }
  check(e, d, what);
  return false;
}

// An event recorded on a stream after a copy from a pinned staging block;
// the block goes back to its allocator only once the copy is complete.
// A pinned block, returned at scope exit unless an event took it over.
// A large host copy (into pinned staging) on several cores where the
// machine has them: one core's memcpy (5-10 GB/s) is slower than the link it
// feeds, and a data set's upload waits on it.
void parallel_copy(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t least_part = std::size_t{2} << 20;
  const std::size_t cores = std::thread::hardware_concurrency();
  const std::size_t parts = std::min<std::size_t>({bytes / least_part, cores / 2, 8});
  if (parts < 2) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const auto part = [&](std::size_t k) {
    const std::size_t from = bytes * k / parts, to = bytes * (k + 1) / parts;
    std::memcpy(static_cast<char*>(dst) + from, static_cast<const char*>(src) + from, to - from);
  };
  std::vector<std::thread> helpers;
  for (std::size_t k = 1; k < parts; ++k) helpers.emplace_back(part, k);
  part(0);
  for (auto& t : helpers) t.join();
}

// One slab of device memory handed out front to back (256-byte aligned) as
// the caching allocator's raw blocks; the allocator keeps every block it
// frees in its lists, so the slab is never given back piecewise, only whole
// with its context. Requests it cannot hold go to cudaMalloc.
class device_arena {
 public:
  void hold(void* base, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mtx_);
    base_ = static_cast<char*>(base);
    bytes_ = bytes;
    used_ = 0;
  }
  void* take(std::size_t n) {
    std::lock_guard<std::mutex> lock(mtx_);
    const std::size_t want = (n + 255) & ~std::size_t{255};
    if (!base_ || want > bytes_ - used_) return nullptr;
    void* p = base_ + used_;
    used_ += want;
    return p;
  }
  bool owns(const void* p) const {
    std::lock_guard<std::mutex> lock(mtx_);
    const auto* c = static_cast<const char*>(p);
    return base_ && c >= base_ && c < base_ + bytes_;
  }
  void* base() const {
    std::lock_guard<std::mutex> lock(mtx_);
    return base_;
  }

 private:
  mutable std::mutex mtx_;
  char* base_ = nullptr;
  std::size_t bytes_ = 0, used_ = 0;
};

class staging_block {
 public:
  staging_block(caching_allocator& a, std::size_t bytes) : a_(a), p_(a.allocate(bytes)) {}
  ~staging_block() {
    if (p_) a_.deallocate(p_);
  }
  staging_block(const staging_block&) = delete;
  staging_block& operator=(const staging_block&) = delete;
  void* get() const noexcept { return p_; }
  void* release() noexcept { return std::exchange(p_, nullptr); }
  caching_allocator& allocator() const noexcept { return a_; }

 private:
  caching_allocator& a_;
  void* p_;
};

class cuda_event final : public device_event {
 public:
  // Records the event on `stream` and takes `staging` over (may be null):
  // once constructed, the event gives the block back when it is reached; a
  // constructor that throws leaves it with `staging`, which gives it back.
  // `keep` holds the context alive for events handed out (null for the
  // context's own).
  cuda_event(std::shared_ptr<const void> keep, const device_spec& d, cudaStream_t stream,
             staging_block* staging)
      : keep_(std::move(keep)), spec_(d) {
    const char* what = "cudaEventCreateWithFlags";
    cudaError_t e = cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      what = "cudaEventRecord";
      e = cudaEventRecord(ev_, stream);
      if (e != cudaSuccess) ignore(cudaEventDestroy(ev_));
    }
    if (e != cudaSuccess) {
      ev_ = nullptr;
      ignore(cudaStreamSynchronize(stream));  // then the copy no longer reads the block
      check(e, spec_, what);
    }
    if (staging) {
      pinned_ = &staging->allocator();
      staging_ = staging->release();
    }
  }
  ~cuda_event() override {
    device_guard g(spec_.index);
    ignore(cudaEventSynchronize(ev_));  // the copy may still read the staging block
    give_back_staging();
    ignore(cudaEventDestroy(ev_));
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;

  bool done() const override {
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error; must not surface at a later launch check
      return false;
    }
    check(e, spec_, "cudaEventQuery");
    return false;
  }
  cudaEvent_t get() const noexcept { return ev_; }

 private:
  void give_back_staging() noexcept {
    if (!staging_) return;
    try {
      pinned_->deallocate(staging_);
    } catch (...) {  // not ours: cannot happen
    }
    staging_ = nullptr;
  }
  std::shared_ptr<const void> keep_;
  device_spec spec_;
  caching_allocator* pinned_ = nullptr;
  void* staging_ = nullptr;
  cudaEvent_t ev_ = nullptr;
};

class cuda_context final : public device_context,
                           public std::enable_shared_from_this<cuda_context> {
 public:
  explicit cuda_context(const device_spec& d)
      : spec_(d),
        arena_(std::make_shared<device_arena>()),
        device_alloc_(
            d.str(),
            [d, arena = arena_](std::size_t n) -> void* {
              if (void* p = arena->take(n)) return p;
              device_guard g(d.index);
              void* p = nullptr;
              return raw_result(cudaMalloc(&p, n), d, "cudaMalloc") ? p : nullptr;
            },
            [i = d.index, arena = arena_](void* p) {
              if (arena->owns(p)) return;  // the arena's memory goes with the context
              device_guard g(i);
              ignore(cudaFree(p));
            }),
        pinned_alloc_(
            d.str() + " pinned staging",
            [d](std::size_t n) -> void* {
              device_guard g(d.index);
              void* p = nullptr;
              return raw_result(cudaHostAlloc(&p, n, cudaHostAllocDefault), d, "cudaHostAlloc")
                         ? p
                         : nullptr;
            },
            [i = d.index](void* p) {
              device_guard g(i);
              ignore(cudaFreeHost(p));
            }) {
    if (d.kind != device_spec::kind_t::cuda) throw device_error(d.str() + ": not a CUDA device");
    // The calling thread is the device's thread: the device stays current on it.
    check(cudaSetDevice(d.index), d, "cudaSetDevice");
    try {
      check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), d,
            "cudaStreamCreateWithFlags (compute)");
      check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), d,
            "cudaStreamCreateWithFlags (copy)");
      try {
        ops_ = kernels::make_cuda_backend(compute_);
      } catch (const std::exception& e) {
        throw device_error(d.str() + ": " + e.what());
      }
    } catch (...) {
      destroy_streams();
      throw;
    }
  }

  ~cuda_context() override {
    device_guard g(spec_.index);
    ignore(cudaStreamSynchronize(compute_));
    ignore(cudaStreamSynchronize(copy_));
    pending_.clear();  // every copy is done: staging blocks back to the cache
    ops_.reset();      // cublasDestroy
    device_alloc_.release_cached();
    pinned_alloc_.release_cached();
    if (arena_->base()) ignore(cudaFree(arena_->base()));
    destroy_streams();
  }
  cuda_context(const cuda_context&) = delete;
  cuda_context& operator=(const cuda_context&) = delete;

  const device_spec& spec() const override { return spec_; }
  bool shares_host_memory() const override { return false; }

  device_buffer allocate(std::size_t bytes) override {
    void* p = device_alloc_.allocate(bytes);
    // The deleter holds the context (and so the allocator) alive: buffers
    // may outlive every other reference to it, and be dropped on any thread.
    return device_buffer(
        std::shared_ptr<void>(
            p, [self = shared_from_this()](void* q) { self->device_alloc_.deallocate(q); }),
        bytes);
  }

  // Staged into pinned memory, then copied on the compute stream (ordered
  // before the compute issued after it). The staging block is kept, with an
  // event recorded after the copy, until the event is reached: synchronizing
  // here instead would be simpler but would stall the device thread behind
  // all the compute queued before (the host would wait for the GPU on every
  // upload); with the event the call returns at once, and the blocks come
  // back to the cache on later calls (reap) or at synchronize(). A large
  // copy (a data set) goes in pieces, so that it needs a few staging blocks
  // of kStagingPiece, not a pinned block of its size (slow to make, and kept
  // in the cache after).
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    refuse_in_capture("copy_to_device");
    count_up(bytes);
    for (std::size_t at = 0; at < bytes; at += kStagingPiece)
      copy_piece(static_cast<char*>(dst) + at, static_cast<const char*>(src) + at,
                 std::min(kStagingPiece, bytes - at));
  }
  static constexpr std::size_t kStagingPiece = std::size_t{16} << 20;
  void copy_piece(void* dst, const void* src, std::size_t bytes) {
    reap();
    staging_block stage(pinned_alloc_, bytes);
    parallel_copy(stage.get(), src, bytes);
    check(cudaMemcpyAsync(dst, stage.get(), bytes, cudaMemcpyHostToDevice, compute_), spec_,
          "copy_to_device: cudaMemcpyAsync");
    try {
      pending_.push_back(std::make_unique<cuda_event>(nullptr, spec_, compute_, &stage));
    } catch (...) {
      ignore(cudaStreamSynchronize(compute_));  // before `stage` gives the block back
      throw;
    }
  }

  // After the compute issued before it: copied into pinned memory on the
  // compute stream, which is synchronized, then out to `dst`.
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    refuse_in_capture("copy_to_host");
    {
      std::lock_guard lock(stats_mtx_);
      ++transfers_.downloads;
      transfers_.bytes_down += bytes;
    }
    staging_block stage(pinned_alloc_, bytes);
    check(cudaMemcpyAsync(stage.get(), src, bytes, cudaMemcpyDeviceToHost, compute_), spec_,
          "copy_to_host: cudaMemcpyAsync");
    check(cudaStreamSynchronize(compute_), spec_, "copy_to_host: cudaStreamSynchronize");
    std::memcpy(dst, stage.get(), bytes);
  }

  // Staged now (the caller may reuse src), copied on the copy stream; the
  // event owns the staging block until the copy is complete.
  std::shared_ptr<device_event> upload_async(void* dst, const void* src,
                                             std::size_t bytes) override {
    refuse_in_capture("upload_async");
    count_up(bytes);
    reap();
    std::optional<staging_block> stage;
    if (bytes > 0) {
      stage.emplace(pinned_alloc_, bytes);
      std::memcpy(stage->get(), src, bytes);
      // dst may be a block the caching allocator took back while compute
      // already issued still reads it (the allocator orders reuse on the
      // compute stream only): the copy stream waits for that compute first.
      // Issued ahead of the step that overlaps it, this costs no overlap.
      cudaEvent_t issued = nullptr;
      check(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming), spec_,
            "upload_async: cudaEventCreateWithFlags");
      cudaError_t ordered = cudaEventRecord(issued, compute_);
      if (ordered == cudaSuccess) ordered = cudaStreamWaitEvent(copy_, issued, 0);
      cudaEventDestroy(issued);  // released once the wait has passed
      check(ordered, spec_, "upload_async: ordering after the compute stream");
      check(cudaMemcpyAsync(dst, stage->get(), bytes, cudaMemcpyHostToDevice, copy_), spec_,
            "upload_async: cudaMemcpyAsync");
    }
    try {
      return std::make_shared<cuda_event>(std::shared_ptr<const void>(shared_from_this()), spec_,
                                          copy_, stage ? &*stage : nullptr);
    } catch (...) {
      ignore(cudaStreamSynchronize(copy_));  // before `stage` gives the block back
      throw;
    }
  }

  void wait(const std::shared_ptr<device_event>& e) override {
    if (!e) return;
    const auto* ce = dynamic_cast<const cuda_event*>(e.get());
    if (!ce) throw device_error(spec_.str() + ": wait: the event is not a CUDA device's");
    check(cudaStreamWaitEvent(compute_, ce->get(), 0), spec_, "wait: cudaStreamWaitEvent");
  }

  void synchronize() override {
    refuse_in_capture("synchronize");
    check(cudaStreamSynchronize(compute_), spec_, "synchronize (compute stream)");
    check(cudaStreamSynchronize(copy_), spec_, "synchronize (copy stream)");
    pending_.clear();  // all reached
  }

  kernels::backend& ops() override { return *ops_; }
  std::unique_ptr<device_graph> capture(const std::function<void()>& body) override;
  // Device memory for the allocator's first blocks, in one cudaMalloc made
  // now: each cudaMalloc synchronises the device and takes 0.1-1 ms, and a
  // model's build and first step ask for dozens of sizes.
  void reserve_arena(std::size_t bytes) {
    if (arena_->base() || bytes == 0) return;
    device_guard g(spec_.index);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // no arena: every block is a cudaMalloc of its own
      return;
    }
    arena_->hold(p, bytes);
  }
  // Pinned staging blocks for a large upload's pieces, made now (a
  // cudaHostAlloc of 16 MB takes milliseconds) and kept in the cache.
  void reserve_staging(int pieces) {
    std::vector<std::unique_ptr<staging_block>> blocks;
    for (int k = 0; k < pieces; ++k)
      blocks.push_back(std::make_unique<staging_block>(pinned_alloc_, kStagingPiece));
  }
  std::optional<std::size_t> free_memory() const override {
    device_guard g(spec_.index);
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    // What the allocator holds cached is free to this context too.
    return free + device_alloc_.statistics().bytes_cached;
  }
  caching_allocator::stats memory_stats() const override { return device_alloc_.statistics(); }
  transfer_stats transfers() const override {
    std::lock_guard lock(stats_mtx_);
    return transfers_;
  }

  cudaStream_t compute_stream() const noexcept { return compute_; }

 private:
  friend class cuda_graph;
  void refuse_in_capture(const char* what) const {
    if (capturing_)
      throw device_error(spec_.str() + ": " + what +
                         " inside a captured step (a graph cannot replay a transfer)");
  }
  // Ends a capture that body left by an exception: the partial graph goes.
  void abandon_capture() noexcept {
    capturing_ = false;
    cudaGraph_t partial = nullptr;
    ignore(cudaStreamEndCapture(compute_, &partial));
    if (partial) ignore(cudaGraphDestroy(partial));
  }
  void count_up(std::size_t bytes) {
    std::lock_guard lock(stats_mtx_);
    ++transfers_.uploads;
    transfers_.bytes_up += bytes;
  }
  // Returns the staging blocks of completed copy_to_device calls to the
  // cache. Their events are on one stream, so they complete in order.
  void reap() {
    while (!pending_.empty() && pending_.front()->done()) pending_.pop_front();
  }
  void destroy_streams() noexcept {
    if (compute_) ignore(cudaStreamDestroy(compute_));
    if (copy_) ignore(cudaStreamDestroy(copy_));
    compute_ = copy_ = nullptr;
  }

  device_spec spec_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  std::unique_ptr<kernels::backend> ops_;
  std::shared_ptr<device_arena> arena_;  // before device_alloc_, which uses it
  caching_allocator device_alloc_;
  caching_allocator pinned_alloc_;
  std::deque<std::unique_ptr<cuda_event>> pending_;  // copy_to_device staging in flight
  bool capturing_ = false;
  mutable std::mutex stats_mtx_;
  transfer_stats transfers_;
};

// An instantiated CUDA graph of the context's compute stream; launched on
// that stream. Holds the context (its stream and buffers) alive.
class cuda_graph final : public device_graph {
 public:
  cuda_graph(std::shared_ptr<cuda_context> ctx, cudaGraphExec_t exec, std::size_t nodes)
      : ctx_(std::move(ctx)), exec_(exec), nodes_(nodes) {}
  ~cuda_graph() override {
    device_guard g(ctx_->spec_.index);
    ignore(cudaGraphExecDestroy(exec_));
  }
  cuda_graph(const cuda_graph&) = delete;
  cuda_graph& operator=(const cuda_graph&) = delete;
  void launch() override {
    check(cudaGraphLaunch(exec_, ctx_->compute_), ctx_->spec_, "cudaGraphLaunch");
  }
  std::size_t operations() const override { return nodes_; }

 private:
  std::shared_ptr<cuda_context> ctx_;
  cudaGraphExec_t exec_;
  std::size_t nodes_;
};

// Thread-local capture mode: only this (the device's) thread is checked for
// calls that cannot be captured; the body's own transfers are refused above.
std::unique_ptr<device_graph> cuda_context::capture(const std::function<void()>& body) {
  if (capturing_) throw device_error(spec_.str() + ": capture inside a capture");
  check(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal), spec_,
        "cudaStreamBeginCapture");
  capturing_ = true;
  try {
    body();
  } catch (...) {
    abandon_capture();
    throw;
  }
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(compute_, &graph), spec_, "cudaStreamEndCapture");
  std::size_t nodes = 0;
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0ULL);
  ignore(cudaGraphDestroy(graph));
  check(e, spec_, "cudaGraphInstantiate");
  return std::make_unique<cuda_graph>(shared_from_this(), exec, nodes);
}

}  // namespace

namespace {

// Contexts made by prepare_cuda_device, by device index, each taken by the
// first make_cuda_context of its device.
std::mutex prepared_mutex;
std::map<int, std::shared_ptr<cuda_context>> prepared;

// One small product through each library path a step takes (cuBLASLt's
// fused bias and ReLU, cuBLAS's plain GEMMs) and, for a convnet, one
// convolution forward and backward: the libraries load, make their handles'
// state and load their first kernels here, not in the first step.
void first_library_calls(cuda_context& c, bool convolutions) {
  // A slab for the model's and the first step's blocks: 1/16 of the free
  // memory, at most 256 MB.
  const std::size_t free = c.free_memory().value_or(0);
  c.reserve_arena(std::min<std::size_t>(free / 16, std::size_t{256} << 20) & ~std::size_t{255});
  constexpr int64_t n = 16;
  auto a = c.allocate(n * n * sizeof(float)), b = c.allocate(n * n * sizeof(float)),
       y = c.allocate(n * n * sizeof(float)), g = c.allocate(n * n * sizeof(float));
  auto* pa = static_cast<float*>(a.data());
  auto* pb = static_cast<float*>(b.data());
  auto* py = static_cast<float*>(y.data());
  auto* pg = static_cast<float*>(g.data());
  auto& ops = c.ops();
  ops.fill(pa, 0.0f, n * n);
  ops.fill(pb, 0.0f, n * n);
  ops.dense_forward(pa, pb, pa, py, n, n, n, kernels::activation::relu);
  ops.dense_backward(pa, pb, py, pg, pb, nullptr, n, n, n, false);
  if (convolutions) {
    kernels::conv2d_shape s;
    s.batch = 1;
    s.in_channels = s.out_channels = 1;
    s.in_h = s.in_w = 4;
    s.kernel_h = s.kernel_w = 3;
    s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
    ops.conv2d_forward(s, pa, pb, pa, py);
    ops.conv2d_backward(s, pa, pb, py, pg, pb, pa, false);
  }
  c.synchronize();
  // A data set's upload keeps about three pieces in flight (copy_to_device).
  c.reserve_staging(3);
}

}  // namespace

void prepare_cuda_device(const device_spec& d, bool convolutions) {
  device_guard g(d.index);
  // The primary context is made by the first call that needs one.
  check(cudaFree(nullptr), d, "cudaFree (context creation)");
  auto c = std::make_shared<cuda_context>(d);
  try {
    first_library_calls(*c, convolutions);
  } catch (const std::exception& e) {
    throw device_error(d.str() + ": " + e.what());
  }
  std::lock_guard<std::mutex> lock(prepared_mutex);
  prepared[d.index] = std::move(c);
}

void release_prepared_cuda_devices() {
  std::map<int, std::shared_ptr<cuda_context>> left;
  {
    std::lock_guard<std::mutex> lock(prepared_mutex);
    left.swap(prepared);
  }
}

bool cuda_device_prepared(int index) {
  std::lock_guard<std::mutex> lock(prepared_mutex);
  return prepared.count(index) > 0;
}

std::shared_ptr<device_context> make_cuda_context(const device_spec& d) {
  std::shared_ptr<cuda_context> ready;
  {
    std::lock_guard<std::mutex> lock(prepared_mutex);
    auto it = prepared.find(d.index);
    if (it != prepared.end()) {
      ready = std::move(it->second);
      prepared.erase(it);
    }
  }
  if (!ready) return std::make_shared<cuda_context>(d);
  // As the constructor does: the calling thread is the device's thread.
  check(cudaSetDevice(d.index), d, "cudaSetDevice");
  return ready;
}

void* cuda_compute_stream(device_context& ctx) {
  auto* c = dynamic_cast<cuda_context*>(&ctx);
  if (!c) throw device_error(ctx.spec().str() + " is not a CUDA device context");
  return c->compute_stream();
}

}  // namespace troupe
