// The device contexts that live in host memory: cpu:N (shared with the host)
// and sim:N (memory of its own, a copy thread, events), and the factory.
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "devices/cuda_context.hpp"
#include "devices/device_context.hpp"
#include "devices/recording_backend.hpp"

namespace troupe {
namespace {

void* aligned_host_alloc(std::size_t bytes) {
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}

class host_event final : public device_event {
 public:
  bool done() const override {
    std::lock_guard lock(mtx_);
    return done_;
  }
  void set() {
    std::lock_guard lock(mtx_);
    done_ = true;
    cv_.notify_all();
  }
  void wait() const {
    std::unique_lock lock(mtx_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  mutable std::mutex mtx_;
  mutable std::condition_variable cv_;
  bool done_ = false;
};

// What both host contexts share: memory from a caching allocator over
// aligned host memory, the CPU backend, transfer counts.
class host_context_base : public device_context,
                          public std::enable_shared_from_this<host_context_base> {
 public:
  explicit host_context_base(device_spec d)
      : spec_(d), alloc_(d.str(), aligned_host_alloc, [](void* p) { std::free(p); }) {}
  const device_spec& spec() const override { return spec_; }
  device_buffer allocate(std::size_t bytes) override {
    void* p = alloc_.allocate(bytes);
    on_allocate(p, bytes);
    // The allocator outlives every buffer: contexts are held by whoever holds buffers.
    return device_buffer(
        std::shared_ptr<void>(p, [a = alloc_keeper()](void* q) { a->deallocate(q); }), bytes);
  }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    count_up(bytes);
    std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    {
      std::lock_guard lock(stats_mtx_);
      ++transfers_.downloads;
      transfers_.bytes_down += bytes;
    }
    std::memcpy(dst, src, bytes);
  }
  kernels::backend& ops() override { return kernels::cpu_backend(); }
  caching_allocator::stats memory_stats() const override { return alloc_.statistics(); }
  transfer_stats transfers() const override {
    std::lock_guard lock(stats_mtx_);
    return transfers_;
  }

 protected:
  virtual void on_allocate(void*, std::size_t) {}
  void count_up(std::size_t bytes) {
    std::lock_guard lock(stats_mtx_);
    ++transfers_.uploads;
    transfers_.bytes_up += bytes;
  }
  // The allocator, for buffers' deleters: an aliasing handle that keeps the
  // whole context (the allocator is a member) alive until the last buffer
  // is returned. Contexts are always held by shared_ptr.
  std::shared_ptr<caching_allocator> alloc_keeper() {
    return std::shared_ptr<caching_allocator>(shared_from_this(), &alloc_);
  }

 private:
  device_spec spec_;
  caching_allocator alloc_;
  mutable std::mutex stats_mtx_;
  transfer_stats transfers_;
};

class cpu_context final : public host_context_base {
 public:
  using host_context_base::host_context_base;
  bool shares_host_memory() const override { return true; }
  std::shared_ptr<device_event> upload_async(void* dst, const void* src,
                                             std::size_t bytes) override {
    copy_to_device(dst, src, bytes);
    auto e = std::make_shared<host_event>();
    e->set();
    return e;
  }
  void wait(const std::shared_ptr<device_event>&) override {}
  void synchronize() override {}
};

// sim:N: a discrete device made of host memory. New blocks are filled with
// NaN bit patterns, so a model that reads memory it never wrote (a missed
// upload) produces NaN, not a plausible number; uploads on the copy thread
// land only when their event says so.
class sim_context final : public host_context_base {
 public:
  explicit sim_context(device_spec d) : host_context_base(d), copier_([this] { copy_loop(); }) {}
  ~sim_context() override {
    {
      std::lock_guard lock(q_mtx_);
      stop_ = true;
    }
    q_cv_.notify_all();
    copier_.join();
  }
  bool shares_host_memory() const override { return false; }
  kernels::backend& ops() override {
    return recorder_ ? static_cast<kernels::backend&>(*recorder_) : kernels::cpu_backend();
  }
  std::unique_ptr<device_graph> capture(const std::function<void()>& body) override;
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    refuse_in_capture("copy_to_device");
    host_context_base::copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    refuse_in_capture("copy_to_host");
    host_context_base::copy_to_host(dst, src, bytes);
  }

  std::shared_ptr<device_event> upload_async(void* dst, const void* src,
                                             std::size_t bytes) override {
    refuse_in_capture("upload_async");
    count_up(bytes);
    // Staged now (as into pinned memory), so the caller may reuse src.
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    auto e = std::make_shared<host_event>();
    {
      std::lock_guard lock(q_mtx_);
      copies_.push_back([dst, staged, e] {
        std::memcpy(dst, staged->data(), staged->size());
        e->set();
      });
    }
    q_cv_.notify_one();
    return e;
  }
  void wait(const std::shared_ptr<device_event>& e) override {
    if (auto* h = dynamic_cast<host_event*>(e.get())) h->wait();
  }
  void synchronize() override {
    refuse_in_capture("synchronize");
    auto e = std::make_shared<host_event>();
    {
      std::lock_guard lock(q_mtx_);
      copies_.push_back([e] { e->set(); });
    }
    q_cv_.notify_one();
    e->wait();
  }

 private:
  void refuse_in_capture(const char* what) const {
    if (recorder_)
      throw device_error(spec().str() + ": " + what +
                         " inside a captured step (a graph cannot replay a transfer)");
  }
  void on_allocate(void* p, std::size_t bytes) override { std::memset(p, 0xff, bytes); }
  void copy_loop() {
    std::unique_lock lock(q_mtx_);
    for (;;) {
      q_cv_.wait(lock, [this] { return stop_ || !copies_.empty(); });
      if (copies_.empty()) return;
      auto task = std::move(copies_.front());
      copies_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }
  std::unique_ptr<recording_backend> recorder_;  // while capturing
  std::mutex q_mtx_;
  std::condition_variable q_cv_;
  std::deque<std::function<void()>> copies_;
  bool stop_ = false;
  std::thread copier_;
};

class recorded_graph final : public device_graph {
 public:
  explicit recorded_graph(std::vector<recording_backend::call> calls) : calls_(std::move(calls)) {}
  void launch() override {
    for (auto& c : calls_) c();
  }
  std::size_t operations() const override { return calls_.size(); }

 private:
  std::vector<recording_backend::call> calls_;
};

std::unique_ptr<device_graph> sim_context::capture(const std::function<void()>& body) {
  if (recorder_) throw device_error(spec().str() + ": capture inside a capture");
  std::vector<recording_backend::call> calls;
  recorder_ = std::make_unique<recording_backend>(kernels::cpu_backend(), calls);
  try {
    body();
  } catch (...) {
    recorder_.reset();
    throw;
  }
  recorder_.reset();
  return std::make_unique<recorded_graph>(std::move(calls));
}

}  // namespace

std::thread prepare_devices(const std::vector<std::string>& devices, bool convolutions) {
  std::vector<device_spec> cuda;
  for (const auto& name : devices) {
    try {
      const auto d = parse_device(name);
      if (d.kind == device_spec::kind_t::cuda) cuda.push_back(d);
    } catch (const device_error&) {  // the config's check reports it
    }
  }
  if (cuda.empty()) return {};
  return std::thread([cuda, convolutions] {
    for (const auto& d : cuda) {
      try {
        prepare_cuda_device(d, convolutions);
      } catch (const std::exception&) {  // make_device_context reports it, with its context
      }
    }
  });
}

void release_prepared_devices() {
  release_prepared_cuda_devices();
}

std::shared_ptr<device_context> make_device_context(const device_spec& d) {
  switch (d.kind) {
    case device_spec::kind_t::cpu:
      return std::make_shared<cpu_context>(d);
    case device_spec::kind_t::sim:
      return std::make_shared<sim_context>(d);
    case device_spec::kind_t::cuda:
      check_device_available(d);
      return make_cuda_context(d);
  }
  throw device_error("unknown device kind for " + d.str());
}

std::shared_ptr<device_context> discrete_device_context(const std::string& name) {
  device_spec d;
  try {
    d = parse_device(name);
  } catch (const device_error&) {
    return nullptr;  // a thread's own label ("inference_server"), not a device
  }
  return d.discrete() ? make_device_context(d) : nullptr;
}

}  // namespace troupe
