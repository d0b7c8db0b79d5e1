#pragma once
// Devices: where compute runs. A cpu_device is one dedicated thread with a FIFO
// of tasks, never a CAF scheduler thread, so a replica's forward/backward never
// blocks message handling. `cuda:N` is recognised in configs; it is accepted
// only when this build has the CUDA path and the GPU is visible.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace troupe {

class device_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct device_spec {
  enum class kind_t { cpu, cuda };
  kind_t kind = kind_t::cpu;
  int index = 0;
  std::string str() const;
  friend bool operator==(const device_spec&, const device_spec&) = default;
};

// Parses "cpu:N" / "cuda:N"; throws device_error ("expected \"cpu:N\" or \"cuda:N\", got ...").
device_spec parse_device(const std::string& s);

// Number of visible CUDA devices; 0 without a CUDA build or GPU. When 0,
// *why (if given) says which of the two it is.
int cuda_device_count(std::string* why = nullptr);
bool built_with_cuda() noexcept;

// Throws device_error when the device cannot be used here, e.g.
// "cuda:0 requested, but no CUDA device is visible (cudaGetDeviceCount: ...)".
void check_device_available(const device_spec& d);

// One thread that runs submitted tasks in order. Tasks must not throw (wrap
// them); the destructor finishes queued tasks and background work, and joins.
//
// Background work fills the time the device would otherwise wait (a replica
// waiting for a collective): a background job is a function called again and
// again, each call doing a small, bounded piece and returning true once the
// job is done. A piece runs only when no task is queued, so a task waits for
// at most one piece; background jobs run one after another, in order.
class cpu_device {
 public:
  explicit cpu_device(std::string name);
  ~cpu_device();
  cpu_device(const cpu_device&) = delete;
  cpu_device& operator=(const cpu_device&) = delete;

  void submit(std::function<void()> task);
  void submit_background(std::function<bool()> piece);

  // The device thread's nice value (Linux: per thread).
  static constexpr int compute_nice = 5;
  const std::string& name() const noexcept { return name_; }

 private:
  // The queue lives as long as the thread that drains it: the last owner of
  // a device may drop it from one of its own tasks (an actor that dies on the
  // device thread), and then the thread finishes on its own.
  struct queue {
    std::mutex mtx;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;
    std::deque<std::function<bool()>> background;
    bool stop = false;
  };
  static void loop(queue& q);
  std::string name_;
  std::shared_ptr<queue> q_ = std::make_shared<queue>();
  std::thread thread_;
};

}  // namespace troupe
