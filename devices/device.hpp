#pragma once
// Devices: where compute runs. A cpu_device is one dedicated thread with a FIFO
// of tasks, never a CAF scheduler thread, so a replica's forward/backward never
// blocks message handling. What computes on a device, and where its memory
// is, is the device's context (devices/device_context.hpp): `cpu:N` (host
// memory), `sim:N` (a CPU device with memory of its own, standing in for an
// accelerator in tests) and `cuda:N` (accepted only when this build has the
// CUDA path and the GPU is visible).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe {

class device_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct device_spec {
  enum class kind_t { cpu, cuda, sim };
  kind_t kind = kind_t::cpu;
  int index = 0;
  std::string str() const;
  // Memory of its own (cuda, sim): variables and gradients need copies to
  // and from the host.
  bool discrete() const noexcept { return kind != kind_t::cpu; }
  friend bool operator==(const device_spec&, const device_spec&) = default;
};

// Parses "cpu:N" / "cuda:N" / "sim:N"; throws device_error ("expected
// \"cpu:N\", \"cuda:N\" or \"sim:N\", got ...").
device_spec parse_device(const std::string& s);

// Number of visible CUDA devices; 0 without a CUDA build or GPU. When 0,
// *why (if given) says which of the two it is.
int cuda_device_count(std::string* why = nullptr);
bool built_with_cuda() noexcept;

// Throws device_error when the device cannot be used here, e.g.
// "cuda:0 requested, but no CUDA device is visible (cudaGetDeviceCount: ...)".
void check_device_available(const device_spec& d);

// Background work shared by the devices of a process: a background job is a
// function called again and again, each call doing a small, bounded piece
// and returning true once the job is done. Whichever device thread of the
// group is idle runs the next piece (one thread at a time per job; separate
// jobs may run on several idle devices at once, and so finish out of order).
// It fills the time devices would otherwise wait: in a synchronous step the
// replica that finished first waits for the others, and its thread does the
// next batches' gathers, for itself and for the others.
class device_group {
 public:
  // `done`, if given, runs once after the last piece, on the device thread
  // that ran it, under the group's lock: whoever learns of the result from
  // it (a message it sends) and then queues a task on a device of the group
  // takes that lock after it, so the job's writes are ordered before the
  // task in ThreadSanitizer's terms too (CAF's mailboxes are invisible to
  // it: libcaf is not instrumented). Keep it short: a flag and a message.
  void submit_background(std::function<bool()> piece, std::function<void()> done = {});

 private:
  friend class cpu_device;
  struct member;
  struct job {
    std::function<bool()> piece;
    std::function<void()> done;
  };
  std::mutex mtx_;
  std::deque<std::shared_ptr<job>> jobs_;
  std::vector<member*> members_;  // device threads running, to wake
};

// One thread that runs submitted tasks in order (design note "threading",
// docs/design.md section 8), and its group's background
// pieces when no task is queued (so a task waits for at most one piece).
// Tasks must not throw (wrap them); the destructor finishes queued tasks
// (the last device of a group to stop also the group's background work) and
// joins.
class cpu_device {
 public:
  explicit cpu_device(std::string name,
                      std::shared_ptr<device_group> group = std::make_shared<device_group>());
  ~cpu_device();
  cpu_device(const cpu_device&) = delete;
  cpu_device& operator=(const cpu_device&) = delete;

  void submit(std::function<void()> task);
  // Background work for this device's group.
  void submit_background(std::function<bool()> piece, std::function<void()> done = {}) {
    group_->submit_background(std::move(piece), std::move(done));
  }

  // The device thread's nice value (Linux: per thread).
  static constexpr int compute_nice = 5;
  const std::string& name() const noexcept { return name_; }

 private:
  static void loop(std::shared_ptr<device_group::member> m);
  std::string name_;
  std::shared_ptr<device_group> group_;
  // Lives as long as the thread that drains it: the last owner of a device
  // may drop it from one of its own tasks (an actor that dies on the device
  // thread), and then the thread finishes on its own.
  std::shared_ptr<device_group::member> m_;
  std::thread thread_;
};

// A process's devices by name ("cpu:0"), one thread each, made on first use
// and sharing one group (their background work): how the topology builder
// and a strategy's own workers get their devices.
class device_pool {
 public:
  std::shared_ptr<cpu_device> get(const std::string& name);
  bool empty() const { return devices_.empty(); }
  // Joins the device threads after their last task (once no actor uses them).
  void clear() { devices_.clear(); }

 private:
  std::shared_ptr<device_group> group_ = std::make_shared<device_group>();
  std::map<std::string, std::shared_ptr<cpu_device>> devices_;
};

}  // namespace troupe
