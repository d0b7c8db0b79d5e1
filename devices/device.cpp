#include "devices/device.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>

#ifdef TROUPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace troupe {

std::string device_spec::str() const {
  return (kind == kind_t::cpu ? "cpu:" : "cuda:") + std::to_string(index);
}

device_spec parse_device(const std::string& s) {
  auto bad = [&] { return device_error("expected \"cpu:N\" or \"cuda:N\", got \"" + s + "\""); };
  auto colon = s.find(':');
  if (colon == std::string::npos) throw bad();
  device_spec d;
  std::string k = s.substr(0, colon);
  if (k == "cpu")
    d.kind = device_spec::kind_t::cpu;
  else if (k == "cuda")
    d.kind = device_spec::kind_t::cuda;
  else
    throw bad();
  const char* first = s.data() + colon + 1;
  const char* last = s.data() + s.size();
  if (first == last) throw bad();
  auto [p, ec] = std::from_chars(first, last, d.index);
  if (ec != std::errc{} || p != last || d.index < 0) throw bad();
  return d;
}

bool built_with_cuda() noexcept {
#ifdef TROUPE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count(std::string* why) {
#ifdef TROUPE_HAVE_CUDA
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount returned 0";
  return n;
#else
  if (why) *why = "this troupe build has no CUDA support (nvcc was not found at build time)";
  return 0;
#endif
}

void check_device_available(const device_spec& d) {
  if (d.kind == device_spec::kind_t::cpu) return;
  std::string why;
  int n = cuda_device_count(&why);
  if (n == 0) throw device_error(d.str() + " requested, but no CUDA device is available: " + why);
  if (d.index >= n)
    throw device_error(d.str() + " requested, but only " + std::to_string(n) +
                       " CUDA device(s) are visible");
  // The CUDA training path (cuBLAS dense layers) is not wired into replicas yet.
  throw device_error(
      d.str() + " is visible, but troupe's replicas do not run on CUDA devices yet; use cpu:N");
}

cpu_device::cpu_device(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([q = q_] {
    // Compute yields to the runtime's own threads: a step waits on messages
    // (the collective's, the next batch's) that a scheduler thread must
    // handle at once, and with as many device threads as cores that thread
    // otherwise waits for a device thread's time slice to end (up to ms).
    // Raising one's own nice value needs no privilege; if it fails, nothing
    // is lost but that.
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), compute_nice);
    loop(*q);
  });
  // Linux limits thread names to 15 characters.
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

cpu_device::~cpu_device() {
  {
    std::lock_guard<std::mutex> g(q_->mtx);
    q_->stop = true;
  }
  q_->cv.notify_one();
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();  // dropped by one of its own tasks: the loop ends after it
  else
    thread_.join();
}

void cpu_device::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> g(q_->mtx);
    q_->tasks.push_back(std::move(task));
  }
  q_->cv.notify_one();
}

void cpu_device::submit_background(std::function<bool()> piece) {
  {
    std::lock_guard<std::mutex> g(q_->mtx);
    q_->background.push_back(std::move(piece));
  }
  q_->cv.notify_one();
}

void cpu_device::loop(queue& q) {
  for (;;) {
    std::function<void()> task;
    std::function<bool()>* piece = nullptr;
    {
      std::unique_lock<std::mutex> g(q.mtx);
      q.cv.wait(g, [&q] { return q.stop || !q.tasks.empty() || !q.background.empty(); });
      if (!q.tasks.empty()) {
        task = std::move(q.tasks.front());
        q.tasks.pop_front();
      } else if (!q.background.empty()) {
        // Only this thread pops background jobs: the front one stays put
        // while its piece runs unlocked.
        piece = &q.background.front();
      } else {
        return;  // stop and drained
      }
    }
    if (task) {
      task();
      continue;
    }
    if ((*piece)()) {
      std::lock_guard<std::mutex> g(q.mtx);
      q.background.pop_front();
    }
  }
}

}  // namespace troupe
