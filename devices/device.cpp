#include "devices/device.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>

#include "kernels/cpu_isa.hpp"
#include "trace/trace.hpp"

#ifdef TROUPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace troupe {

std::string device_spec::str() const {
  const char* k = kind == kind_t::cpu ? "cpu:" : kind == kind_t::cuda ? "cuda:" : "sim:";
  return k + std::to_string(index);
}

device_spec parse_device(const std::string& s) {
  auto bad = [&] {
    return device_error("expected \"cpu:N\", \"cuda:N\" or \"sim:N\", got \"" + s + "\"");
  };
  auto colon = s.find(':');
  if (colon == std::string::npos) throw bad();
  device_spec d;
  std::string k = s.substr(0, colon);
  if (k == "cpu")
    d.kind = device_spec::kind_t::cpu;
  else if (k == "cuda")
    d.kind = device_spec::kind_t::cuda;
  else if (k == "sim")
    d.kind = device_spec::kind_t::sim;
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
  if (d.kind != device_spec::kind_t::cuda) return;
  std::string why;
  int n = cuda_device_count(&why);
  if (n == 0) throw device_error(d.str() + " requested, but no CUDA device is available: " + why);
  if (d.index >= n)
    throw device_error(d.str() + " requested, but only " + std::to_string(n) +
                       " CUDA device(s) are visible");
}

namespace {
// The device thread's track in a timeline trace: "troupe:cpu:1" is "device:1".
std::string trace_track_name(const std::string& device_name) {
  std::string n = device_name;
  for (const char* prefix : {"troupe:", "cpu:"})
    if (n.rfind(prefix, 0) == 0) n = n.substr(std::char_traits<char>::length(prefix));
  return "device:" + n;
}
}  // namespace

// A device thread's own queue; the group's mutex guards it.
struct device_group::member {
  std::shared_ptr<device_group> group;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  bool stop = false;
};

void device_group::submit_background(std::function<bool()> piece, std::function<void()> done) {
  std::lock_guard<std::mutex> g(mtx_);
  jobs_.push_back(std::make_shared<job>(job{std::move(piece), std::move(done)}));
  for (auto* m : members_) m->cv.notify_one();
}

cpu_device::cpu_device(std::string name, std::shared_ptr<device_group> group)
    : name_(std::move(name)), group_(std::move(group)) {
  m_ = std::make_shared<device_group::member>();
  m_->group = group_;
  {
    std::lock_guard<std::mutex> g(group_->mtx_);
    group_->members_.push_back(m_.get());
  }
  thread_ = std::thread([m = m_, track = trace_track_name(name_)] {
    trace::name_this_thread(track);
    // Compute yields to the runtime's own threads: a step waits on messages
    // (the collective's, the next batch's) that a scheduler thread must
    // handle at once, and with as many device threads as cores that thread
    // otherwise waits for a device thread's time slice to end (up to ms).
    // Raising one's own nice value needs no privilege; if it fails, nothing
    // is lost but that.
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), compute_nice);
    kernels::flush_denormals_on_this_thread();
    loop(m);
  });
  // Linux limits thread names to 15 characters.
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

cpu_device::~cpu_device() {
  {
    std::lock_guard<std::mutex> g(group_->mtx_);
    m_->stop = true;
  }
  m_->cv.notify_one();
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();  // dropped by one of its own tasks: the loop ends after it
  else
    thread_.join();
}

void cpu_device::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> g(group_->mtx_);
    m_->tasks.push_back(std::move(task));
  }
  m_->cv.notify_one();
}

void cpu_device::loop(std::shared_ptr<device_group::member> m) {
  device_group& grp = *m->group;
  std::unique_lock<std::mutex> g(grp.mtx_);
  for (;;) {
    m->cv.wait(g, [&] { return m->stop || !m->tasks.empty() || !grp.jobs_.empty(); });
    if (!m->tasks.empty()) {
      auto task = std::move(m->tasks.front());
      m->tasks.pop_front();
      g.unlock();
      task();
      task = nullptr;  // whatever it holds is released off the lock
      g.lock();
      continue;
    }
    // A stopping device leaves the group's background work to the others,
    // and the last one finishes it.
    if (!grp.jobs_.empty() && (!m->stop || grp.members_.size() == 1)) {
      auto job = std::move(grp.jobs_.front());
      grp.jobs_.pop_front();  // no other thread runs this job meanwhile
      g.unlock();
      bool done = job->piece();
      g.lock();
      if (!done) {
        grp.jobs_.push_front(std::move(job));
        // This thread turns to its own task next, which may wait for this
        // very job (a step for its batch): an idle device that went to
        // sleep while the job was out of the queue must take it up.
        if (!m->tasks.empty())
          for (auto* other : grp.members_)
            if (other != m.get()) other->cv.notify_one();
      } else {
        if (job->done) job->done();
        g.unlock();
        job = nullptr;  // whatever it holds is released off the lock
        g.lock();
      }
      continue;
    }
    if (!m->stop) continue;
    std::erase(grp.members_, m.get());
    return;
  }
}

std::shared_ptr<cpu_device> device_pool::get(const std::string& name) {
  auto& d = devices_[name];
  if (!d) d = std::make_shared<cpu_device>("troupe:" + name, group_);
  return d;
}

}  // namespace troupe
