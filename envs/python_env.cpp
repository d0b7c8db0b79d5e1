#include "envs/python_env.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "envs/plugin_env.hpp"

extern char** environ;

namespace troupe::envs {
namespace {

using json = nlohmann::json;

// The worker's source, compiled in (envs/CMakeLists.txt makes this file
// from envs/python/troupe_env_worker.py).
constexpr const char* kWorkerScript =
#include "troupe_env_worker.inc"
    ;

std::string errno_text(int e) {
  return std::strerror(e);
}

// A descriptor that stays open in no other child: CLOEXEC, and above the
// numbers a worker's are moved to (3, 4).
int moved_up(int fd) {
  const int up = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  if (up < 0) throw std::runtime_error("fcntl: " + errno_text(errno));
  return up;
}

std::string exit_cause(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "stopped (status " + std::to_string(status) + ")";
}

// One worker process: its pid, the socket its commands go down and its
// answers come back on, and the shared memory it steps into.
class worker_process {
 public:
  worker_process(const gymnasium_env_config& g, const std::string& name) : name_(name) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
      throw std::runtime_error("socketpair: " + errno_text(errno));
    sock_ = moved_up(pair[0]);
    const int child_sock = moved_up(pair[1]);
    memory_ = memfd_create("troupe-gymnasium", MFD_CLOEXEC);
    int e = errno;
    if (memory_ >= 0) {
      memory_ = moved_up(memory_);
      e = spawn(g.python, child_sock, memory_);
    }
    close(child_sock);  // the worker's end lives in the worker only: its exit is our EOF
    if (e == 0) return;
    release();  // no destructor runs after a constructor throws
    if (memory_ < 0) throw std::runtime_error("memfd_create: " + errno_text(e));
    throw env_start_error("rl.env.python", "cannot run '" + g.python + "': " + errno_text(e));
  }

  ~worker_process() { release(); }

  worker_process(const worker_process&) = delete;
  worker_process& operator=(const worker_process&) = delete;

  // Sends a command; the worker's answer, or std::runtime_error naming why
  // none came (the worker died).
  json request(const json& command) { return json::parse(exchange(command.dump() + "\n")); }

  // Sends one line (ending in a newline) and reads one back, without it.
  std::string exchange(const std::string& line) {
    for (std::size_t sent = 0; sent < line.size();) {
      // MSG_NOSIGNAL: a dead worker is an error here, not a SIGPIPE for the job.
      const ssize_t n = send(sock_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(died());
      sent += static_cast<std::size_t>(n);
    }
    return read_line();
  }

  void* map(std::size_t bytes) {
    if (ftruncate(memory_, static_cast<off_t>(bytes)) != 0)
      throw std::runtime_error("ftruncate: " + errno_text(errno));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory_, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap: " + errno_text(errno));
    mapped_ = p;
    mapped_bytes_ = bytes;
    return p;
  }

 private:
  void release() {
    if (mapped_) munmap(mapped_, mapped_bytes_);
    if (memory_ >= 0) close(memory_);
    close(sock_);  // the worker reads EOF and exits
    if (pid_ > 0) reap(std::chrono::seconds(2));
  }

  int spawn(const std::string& python, int child_sock, int memory) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_sock, 3);
    posix_spawn_file_actions_adddup2(&actions, memory, 4);
    std::string py = python, dash_c = "-c", script = kWorkerScript, fd3 = "3", fd4 = "4";
    char* argv[] = {py.data(), dash_c.data(), script.data(), fd3.data(), fd4.data(), nullptr};
    const int e = posix_spawnp(&pid_, python.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    if (e != 0) pid_ = -1;
    return e;
  }

  std::string read_line() {
    for (;;) {
      const auto end = buffer_.find('\n');
      if (end != std::string::npos) {
        std::string line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return line;
      }
      char chunk[4096];
      const ssize_t n = read(sock_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error(died());
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // The worker's end closed: it is gone (or going); its exit status says why.
  std::string died() {
    const int status = reap(std::chrono::seconds(5));
    return name_ + ": the Gymnasium worker process (rl.env.python) " +
           (status >= 0 ? exit_cause(status) : "stopped answering") +
           " (its stderr, above in the log, has the details)";
  }

  // Waits for the worker's exit up to `patience`, then kills it; its status.
  int reap(std::chrono::milliseconds patience) {
    if (pid_ <= 0) return -1;
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return status;
  }

  std::string name_;
  pid_t pid_ = -1;
  int sock_ = -1;
  int memory_ = -1;
  void* mapped_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  std::string buffer_;
};

// Where each array lies in the shared memory: the order and types
// troupe_env_worker.py's Batch.map takes them in (8-byte ones first, so every
// array is aligned).
struct shared_layout {
  std::size_t episode_return, episode_length, obs, final_obs, reward, actions, terminated,
      truncated, bytes;
  shared_layout(int64_t n, int64_t obs_size, int64_t action_floats) {
    const auto N = static_cast<std::size_t>(n), O = static_cast<std::size_t>(obs_size);
    episode_return = 0;
    episode_length = episode_return + 8 * N;
    obs = episode_length + 8 * N;
    final_obs = obs + 4 * N * O;
    reward = final_obs + 4 * N * O;
    actions = reward + 4 * N;
    terminated = actions + 4 * N * static_cast<std::size_t>(action_floats);
    truncated = terminated + N;
    bytes = truncated + N;
  }
};

// The key and message of a worker that could not make the environment.
[[noreturn]] void refuse_start(const gymnasium_env_config& g, const json& r) {
  const std::string last = r.value("last", "");
  const std::string where = r.value("error", "");
  if (where == "import")
    throw env_start_error("rl.env.python", "'" + g.python + "' cannot import Gymnasium (" + last +
                                               "): install it into that Python "
                                               "(scripts/install-deps.sh makes a venv with it) "
                                               "or name another in rl.env.python");
  if (where == "wrappers")
    throw env_start_error("rl.env.wrappers[" + std::to_string(r.value("index", 0)) + "]", last);
  if (where == "make")
    throw env_start_error(g.entry_point.empty() ? "rl.env.id" : "rl.env.entry_point",
                          "Gymnasium cannot make '" + g.id + "'" +
                              (g.entry_point.empty() ? "" : " from '" + g.entry_point + "'") +
                              ": " + last);
  if (r.value("space", "") == "observation")
    throw env_start_error("rl.env", "'" + g.id + "' has the observation space " + where +
                                        ", which the policy/value model's input layer cannot "
                                        "take: it takes a Box of floats or of uint8 pixels");
  throw env_start_error("rl.env", "'" + g.id + "' has the action space " + where +
                                      ", which no policy head takes: the softmax head takes "
                                      "Discrete(n), the gaussian one a one-dimensional Box of "
                                      "floats");
}

env_spec spec_from(const std::string& id, const json& r) {
  env_spec s;
  s.name = id;
  s.observation_size = r.at("observation_size").get<int64_t>();
  s.actions = r.value("actions", int64_t{0});
  s.max_episode_steps = r.at("max_episode_steps").get<int64_t>();
  s.observation_shape = r.value("observation_shape", std::vector<int64_t>{});
  s.observation_dtype = r.value("observation_dtype", std::string("float32"));
  if (r.contains("action_low")) {
    s.action_low = r.at("action_low").get<std::vector<float>>();
    s.action_high = r.at("action_high").get<std::vector<float>>();
  }
  return s;
}

class python_vector_env final : public vector_env {
 public:
  python_vector_env(const gymnasium_env_config& g, int64_t instances)
      : worker_(g, "Gymnasium '" + g.id + "'"), n_(instances) {
    if (instances < 1)
      throw std::invalid_argument(g.id + ": expected at least 1 instance, got " +
                                  std::to_string(instances));
    const json made = worker_.request({{"cmd", "make"},
                                       {"id", g.id},
                                       {"kwargs", json::parse(g.kwargs)},
                                       {"entry_point", g.entry_point},
                                       {"wrappers", json::parse(g.wrappers)},
                                       {"instances", instances}});
    if (!made.value("ok", false)) refuse_start(g, made);
    spec_ = spec_from(g.id, made);
    state_size_ = made.value("state_size", int64_t{0});
    layout_ = shared_layout(n_, spec_.observation_size, std::max<int64_t>(1, spec_.action_dims()));
    memory_ = static_cast<char*>(worker_.map(layout_.bytes));
    command({{"cmd", "map"}, {"bytes", layout_.bytes}});
  }

  const env_spec& spec() const override { return spec_; }
  int64_t size() const override { return n_; }
  int64_t state_size() const override { return state_size_; }

  void reset(uint64_t seed, float* obs) override {
    command({{"cmd", "reset"}, {"seed", seed}});
    std::memcpy(obs, memory_ + layout_.obs, obs_bytes());
  }

  void step(const int32_t* actions, const step_output& out) override {
    check_discrete_actions(spec_, n_, actions);
    std::memcpy(memory_ + layout_.actions, actions, 4 * static_cast<std::size_t>(n_));
    advance(out);
  }

  void step_box(const float* actions, const step_output& out) override {
    check_box_actions(spec_, n_, actions);
    const auto floats = static_cast<std::size_t>(n_ * spec_.action_dims());
    std::memcpy(memory_ + layout_.actions, actions, 4 * floats);
    advance(out);
  }

  void get_state(int64_t instance, double* state) const override {
    const json r = command({{"cmd", "get_state"}, {"instance", checked(instance)}});
    const auto s = r.at("state").get<std::vector<double>>();
    std::copy(s.begin(), s.end(), state);
  }

  void set_state(int64_t instance, const double* state) override {
    const std::vector<double> s(state, state + state_size_);
    command({{"cmd", "set_state"}, {"instance", checked(instance)}, {"state", s}});
  }

 private:
  // The step ran in the worker: its results, copied out of the shared memory.
  void advance(const step_output& out) {
    // The doorbell of every step is a bare line each way (JSON costs as much
    // as a few CartPole steps); any other answer is an error's JSON.
    const std::string answer = worker_.exchange("step\n");
    if (answer != "stepped") raise("step", json::parse(answer));
    const auto N = static_cast<std::size_t>(n_);
    std::memcpy(out.obs, memory_ + layout_.obs, obs_bytes());
    std::memcpy(out.final_obs, memory_ + layout_.final_obs, obs_bytes());
    std::memcpy(out.reward, memory_ + layout_.reward, 4 * N);
    std::memcpy(out.terminated, memory_ + layout_.terminated, N);
    std::memcpy(out.truncated, memory_ + layout_.truncated, N);
    std::memcpy(out.episode_return, memory_ + layout_.episode_return, 8 * N);
    std::memcpy(out.episode_length, memory_ + layout_.episode_length, 8 * N);
  }

  // A command's answer; a Python exception in it is a std::runtime_error
  // naming the environment and the traceback's last line.
  json command(const json& c) const {
    json r = worker_.request(c);
    if (!r.value("ok", false)) raise(c.value("cmd", ""), r);
    return r;
  }

  [[noreturn]] void raise(const std::string& command, const json& r) const {
    throw std::runtime_error(spec_.name + " (Gymnasium): " + command + " raised " +
                             r.value("last", std::string("an exception")));
  }

  int64_t checked(int64_t instance) const {
    if (instance < 0 || instance >= n_ || state_size_ == 0)
      throw std::out_of_range(spec_.name + ": no state of instance " + std::to_string(instance) +
                              " of " + std::to_string(n_) +
                              (state_size_ == 0 ? " (the environment has no .state)" : ""));
    return instance;
  }

  std::size_t obs_bytes() const {
    return 4 * static_cast<std::size_t>(n_ * spec_.observation_size);
  }

  mutable worker_process worker_;
  int64_t n_;
  env_spec spec_;
  int64_t state_size_ = 0;
  shared_layout layout_{1, 1, 1};
  char* memory_ = nullptr;
};

std::string cache_key(const gymnasium_env_config& g) {
  return g.python + '\n' + g.id + '\n' + g.kwargs + '\n' + g.entry_point + '\n' + g.wrappers;
}

}  // namespace

std::unique_ptr<vector_env> make_gymnasium_env(const gymnasium_env_config& g, int64_t instances) {
  return std::make_unique<python_vector_env>(g, instances);
}

std::unique_ptr<vector_env> make_job_env(const env_choice& c, int64_t instances) {
  if (c.gymnasium) return make_gymnasium_env(*c.gymnasium, instances);
  if (c.plugin) return make_plugin_env(*c.plugin, instances);
  return make_env(c.name, instances);
}

env_spec job_env_spec(const env_choice& c) {
  if (!c.gymnasium) return make_job_env(c, 1)->spec();  // in-process: cheap to make
  static std::mutex mutex;
  static std::map<std::string, env_spec> known;
  const auto key = cache_key(*c.gymnasium);
  {
    std::lock_guard lock(mutex);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  // Started outside the lock: a second caller may start one too, and both
  // find the same spec.
  auto spec = make_gymnasium_env(*c.gymnasium, 1)->spec();
  std::lock_guard lock(mutex);
  known.emplace(key, spec);
  return spec;
}

}  // namespace troupe::envs
