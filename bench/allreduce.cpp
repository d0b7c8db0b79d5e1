// All-reduce benchmark: median time per all-reduce and bus bandwidth
// (bytes / time * 2(n-1)/n, as nccl-tests) for each algorithm and size, with
// the actor system configuration every troupe process uses
// (actors/system_config.hpp). Used by `troupe bench allreduce ...` and by the
// standalone bench_allreduce (this file compiled with TROUPE_ALLREDUCE_MAIN).
// Then, as a yardstick, OpenMPI's MPI_Allreduce on the same sizes with N
// processes (bench/mpi_allreduce.cpp under mpirun) when both are there.
//
//   bench_allreduce [--replicas N] [--sizes 8,64K,1M,16M,64M]
//                   [--algorithm ring|tree|reduce_to_one|all] [--iterations K] [--json]
//                   [--op mean] [--mpi auto|off|on]
//                   [--bucket-bytes B] [--chunk-bytes B]
//                   [--policy sharing|stealing] [--threads T]   (experiments only)
//   bench_allreduce --algorithm nccl [--devices cuda:0,cuda:1,...] [--sizes ...]
//                   [--iterations K] [--op sum|mean] [--json]
//
// --algorithm nccl times the device collectives (collectives/process_group.hpp)
// instead of the reducer actors: one rank per device, each on a thread of its
// own, all_reduce on device memory; per call, the time from a common start
// to the result on the device (after a synchronize of the compute stream),
// slowest rank, median over the calls, and algbw (bytes / time) and busbw
// (algbw * 2(n-1)/n), as nccl-tests. Default devices: every visible GPU.
// sim:N or cpu:N devices run the in-process host group that stands in for
// NCCL in the tests: that measures the host emulation, not NCCL.
//
// --mpi auto (default) runs the MPI comparison when `mpirun` is on PATH and
// bench_mpi_allreduce is next to this executable (or in bench/ below it, or
// named by TROUPE_MPI_BENCH), else notes why it was skipped; on: missing MPI
// is a usage error; off: never.
#include <iostream>
#include <string>
#include <vector>

#include "bench/allreduce.hpp"

#ifdef TROUPE_ALLREDUCE_MAIN

int main(int argc, char** argv) {
  return troupe::run_allreduce_bench(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                                     std::cerr);
}

#else

#include "actors/reducer.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "actors/system_config.hpp"
#include "bench/bench_sizes.hpp"
#include "collectives/nccl_id.hpp"
#include "collectives/process_group.hpp"
#include "devices/device_context.hpp"

namespace troupe {

namespace {

struct bench_options {
  int replicas = 4;
  std::vector<int64_t> sizes{8, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  std::vector<std::string> algorithms = reducer_algorithms();
  int64_t iterations = 0;  // 0: about 1 GB of payload per size, 20 to 1000
  reduce_op op = reduce_op::mean;
  reducer_config reducer;
  std::string policy;  // empty: system_config's
  int threads = 0;     // 0: system_config's
  bool json = false;
  std::string mpi = "auto";
  bool replicas_given = false;
  // --algorithm nccl: device collectives on these devices (empty: every GPU).
  bool device_collectives = false;
  std::vector<device_spec> devices;
};

// One row of the results, troupe's or MPI's.
struct measurement {
  std::string algorithm;
  int replicas = 0;
  int64_t bytes = 0;
  double seconds = 0;
  double busbw_gbps = 0;
};

int64_t iterations_for(const bench_options& o, int64_t real_bytes) {
  return o.iterations ? o.iterations : bench::default_iterations(real_bytes);
}

using bench::parse_size;
using bench::split_list;

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 20) && b % (int64_t{1} << 20) == 0)
    std::snprintf(buf, sizeof buf, "%lldM", static_cast<long long>(b >> 20));
  else if (b >= 1024 && b % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%lldK", static_cast<long long>(b >> 10));
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(b));
  return buf;
}

// Runs warm-up + iterations all-reduces over the group and replies with the
// seconds each measured one took: an event-based actor, like the replicas
// that call reducers in a job, so no thread wake-up of the caller is timed.
struct driver_state {
  std::vector<reducer_actor> group;
  std::vector<std::vector<tensor> > data;
  reduce_op op = reduce_op::mean;
  int64_t warmup = 0;
  int64_t iterations = 0;
  int64_t round = 0;
  int pending = 0;
  std::chrono::steady_clock::time_point t0;
  std::vector<double> seconds;
  caf::typed_response_promise<std::vector<double> > rp;
  bool failed = false;
};

void next_round(caf::stateful_actor<driver_state>* self) {
  auto& st = self->state;
  if (st.round == st.warmup + st.iterations) {
    st.rp.deliver(st.seconds);
    self->quit();
    return;
  }
  st.pending = static_cast<int>(st.group.size());
  st.t0 = std::chrono::steady_clock::now();
  for (std::size_t r = 0; r < st.group.size(); ++r)
    // No per-request timeout, like the replicas: in CAF 0.17 every timeout is
    // a trip to the clock thread (a condition-variable broadcast per request,
    // measured to cost several microseconds); run_allreduce_bench bounds the
    // whole run instead.
    self->request(st.group[r], caf::infinite, allreduce_atom::value, st.op, st.data[r])
        .then(
            [self](std::vector<tensor>&) {
              auto& s = self->state;
              if (--s.pending > 0) return;
              auto t1 = std::chrono::steady_clock::now();
              if (s.round >= s.warmup)
                s.seconds.push_back(std::chrono::duration<double>(t1 - s.t0).count());
              ++s.round;
              next_round(self);
            },
            [self](caf::error& e) {
              auto& s = self->state;
              if (s.failed) return;
              s.failed = true;
              s.rp.deliver(std::move(e));
              self->quit();
            });
}

caf::behavior driver(caf::stateful_actor<driver_state>* self, std::vector<reducer_actor> group,
                     std::vector<std::vector<tensor> > data, reduce_op op, int64_t warmup,
                     int64_t iterations) {
  auto& st = self->state;
  st.group = std::move(group);
  st.data = std::move(data);
  st.op = op;
  st.warmup = warmup;
  st.iterations = iterations;
  return {
      [self](run_atom) -> caf::result<std::vector<double> > {
        self->state.rp = self->make_response_promise<std::vector<double> >();
        next_round(self);
        return self->state.rp;
      },
  };
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int usage(std::ostream& err, const std::string& why) {
  err << "troupe bench allreduce: " << why << "\n"
      << "usage: troupe bench allreduce [--replicas N] [--sizes 8,64K,1M,16M,64M]\n"
      << "         [--algorithm ring|tree|reduce_to_one|all] [--iterations K] [--json]\n"
      << "         [--op sum|mean|min|max] [--mpi auto|off|on] [--bucket-bytes B]\n"
      << "         [--chunk-bytes B] [--policy sharing|stealing] [--threads T]\n"
      << "       troupe bench allreduce --algorithm nccl [--devices cuda:0,cuda:1,...]\n"
      << "         [--sizes ...] [--iterations K] [--op sum|mean] [--json]\n"
      << "         (NCCL all-reduce on the devices' compute streams; default: every visible\n"
      << "         GPU; sim:N or cpu:N devices time the host emulation, not NCCL)\n";
  return 2;
}

std::string format_time(double sec) {
  char t[32];
  double us = sec * 1e6;
  if (us < 1000)
    std::snprintf(t, sizeof t, "%.1f us", us);
  else
    std::snprintf(t, sizeof t, "%.3f ms", us / 1000);
  return t;
}

std::string json_line(const measurement& m) {
  char line[256];
  std::snprintf(line, sizeof line,
                "{\"algorithm\":\"%s\",\"replicas\":%d,\"bytes\":%lld,\"seconds\":%.9g,"
                "\"busbw_gbps\":%.6g}\n",
                m.algorithm.c_str(), m.replicas, static_cast<long long>(m.bytes), m.seconds,
                m.busbw_gbps);
  return line;
}

std::string table_row(const measurement& m, int64_t iters) {
  char line[256];
  std::snprintf(line, sizeof line, "%-13s %6s %12lld %13s %12.2f\n", m.algorithm.c_str(),
                human_bytes(m.bytes).c_str(), static_cast<long long>(iters),
                format_time(m.seconds).c_str(), m.busbw_gbps);
  return line;
}

// troupe's own measurements, in an actor system of their own that is gone
// before mpirun starts: its idle scheduler threads would otherwise share the
// cores with the MPI ranks.
int run_troupe(const bench_options& o, std::vector<measurement>& results, std::ostream& out,
               std::ostream& err) {
  system_config cfg;
  if (!o.policy.empty())
    cfg.set("scheduler.policy",
            o.policy == "sharing" ? caf::atom("sharing") : caf::atom("stealing"));
  if (o.threads > 0) cfg.set("scheduler.max-threads", static_cast<size_t>(o.threads));
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  const int n = o.replicas;
  int status = 0;
  for (const auto& algo : o.algorithms) {
    auto rc = o.reducer;
    rc.algorithm = algo;
    auto group = spawn_reducer_group(sys, n, rc);
    for (int64_t bytes : o.sizes) {
      int64_t numel = (bytes + 3) / 4;
      int64_t real_bytes = numel * 4;
      int64_t iters = iterations_for(o, real_bytes);
      int64_t warmup = std::max<int64_t>(3, iters / 10);
      std::vector<std::vector<tensor> > data;
      for (int r = 0; r < n; ++r) {
        tensor t({numel});
        float* p = t.f32();
        for (int64_t i = 0; i < numel; ++i) p[i] = static_cast<float>((i + r) % 17) * 0.25f;
        data.push_back({t});
      }
      auto d = sys.spawn(driver, group, std::move(data), o.op, warmup, iters);
      std::vector<double> times;
      self->request(d, std::chrono::minutes(10), run_atom::value)
          .receive([&](std::vector<double>& t) { times = std::move(t); },
                   [&](caf::error& e) {
                     err << "troupe bench allreduce: " << algo << " " << human_bytes(real_bytes)
                         << ": " << describe(e) << "\n";
                   });
      if (times.empty()) {
        status = 1;
        continue;
      }
      measurement m{algo, n, real_bytes, median(times), 0.0};
      if (n > 1)
        m.busbw_gbps = static_cast<double>(real_bytes) / m.seconds * 2.0 * (n - 1) / n / 1e9;
      results.push_back(m);
      out << (o.json ? json_line(m) : table_row(m, iters)) << std::flush;
    }
    for (auto& h : group) self->send_exit(h, caf::exit_reason::user_shutdown);
  }
  return status;
}

// --- --algorithm nccl: device collectives ---

// A barrier for the rank threads that a failed rank breaks, so the others
// do not wait for it.
class rank_barrier {
 public:
  explicit rank_barrier(int n) : n_(n) {}
  // False once broken.
  bool arrive_and_wait() {
    std::unique_lock lock(m_);
    if (broken_) return false;
    const uint64_t g = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return gen_ != g || broken_; });
    return gen_ != g;
  }
  void brk() {
    std::lock_guard lock(m_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  uint64_t gen_ = 0;
  bool broken_ = false;
};

std::string device_list(const std::vector<device_spec>& ds) {
  std::string s;
  for (const auto& d : ds) {
    if (!s.empty()) s += ',';
    s += d.str();
  }
  return s;
}

std::string device_json_line(const measurement& m, double algbw, const std::string& devices) {
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"algorithm\":\"%s\",\"replicas\":%d,\"bytes\":%lld,\"seconds\":%.9g,"
                "\"busbw_gbps\":%.6g,\"algbw_gbps\":%.6g,\"devices\":\"%s\"}\n",
                m.algorithm.c_str(), m.replicas, static_cast<long long>(m.bytes), m.seconds,
                m.busbw_gbps, algbw, devices.c_str());
  return line;
}

// Picks the devices (default: every visible GPU) and says why it cannot
// run: exit status 1 (nothing to run on) or 2 (bad usage), 0 when it can.
int plan_devices(bench_options& o, std::ostream& err) {
  const char* head = "troupe bench allreduce --algorithm nccl: ";
  bool cuda = o.devices.empty() || o.devices[0].kind == device_spec::kind_t::cuda;
  if (!cuda) return 0;
  std::string why;
  int visible = cuda_device_count(&why);
  if (visible == 0) {
    err << head << "no CUDA device is visible: " << why
        << " (--devices sim:0,sim:1 times the host emulation instead)\n";
    return 1;
  }
  if (!built_with_nccl()) {
    err << head << "cuda devices need NCCL: this build has none\n";
    return 1;
  }
  if (o.devices.empty()) {
    int n = o.replicas_given ? o.replicas : visible;
    if (n > visible) {
      err << head << "--replicas " << n << " needs " << n << " GPUs; " << visible
          << " are visible\n";
      return 1;
    }
    for (int i = 0; i < n; ++i) o.devices.push_back({device_spec::kind_t::cuda, i});
  }
  try {
    for (const auto& d : o.devices) check_device_available(d);
  } catch (const device_error& e) {
    err << head << e.what() << "\n";
    return 1;
  }
  return 0;
}

// One rank per device, on a thread of its own (its device's thread: CUDA
// binds the device to it); per call a common start (a barrier), then
// all_reduce and, on a GPU, a synchronize of the compute stream.
int run_device_bench(const bench_options& o, std::vector<measurement>& results, std::ostream& out,
                     std::ostream& err) {
  const int n = static_cast<int>(o.devices.size());
  const bool cuda = o.devices[0].kind == device_spec::kind_t::cuda;
  const std::string algo = cuda ? "nccl" : "host";
  const std::string devices = device_list(o.devices);
  std::shared_ptr<group_rendezvous> group;
  try {
    group = make_device_rendezvous(n, o.devices[0]);
  } catch (const device_error& e) {
    err << "troupe bench allreduce --algorithm nccl: " << e.what() << "\n";
    return 1;
  }
  struct size_plan {
    int64_t numel, bytes, warmup, iters;
  };
  std::vector<size_plan> plans;
  for (int64_t bytes : o.sizes) {
    int64_t numel = (bytes + 3) / 4;
    int64_t iters = iterations_for(o, numel * 4);
    plans.push_back({numel, numel * 4, std::max<int64_t>(3, iters / 10), iters});
  }
  // seconds[size][rank][iteration]
  std::vector<std::vector<std::vector<double> > > seconds(
      plans.size(), std::vector<std::vector<double> >(static_cast<std::size_t>(n)));
  rank_barrier barrier(n);
  std::mutex err_mtx;
  std::string failure;
  auto rank_main = [&](int r) {
    try {
      auto ctx = make_device_context(o.devices[static_cast<std::size_t>(r)]);
      auto comm = group->join(r, *ctx);
      for (std::size_t s = 0; s < plans.size(); ++s) {
        const auto& p = plans[s];
        auto buf = ctx->allocate(static_cast<std::size_t>(p.bytes));
        std::vector<float> host(static_cast<std::size_t>(p.numel));
        for (int64_t i = 0; i < p.numel; ++i)
          host[static_cast<std::size_t>(i)] = static_cast<float>((i + r) % 17) * 0.25f;
        ctx->copy_to_device(buf.data(), host.data(), static_cast<std::size_t>(p.bytes));
        ctx->synchronize();
        auto& mine = seconds[s][static_cast<std::size_t>(r)];
        for (int64_t it = 0; it < p.warmup + p.iters; ++it) {
          if (!barrier.arrive_and_wait()) return;
          auto t0 = std::chrono::steady_clock::now();
          // Data stays as the all-reduces leave it (mean keeps it bounded).
          comm->all_reduce(buf.f32(), static_cast<std::size_t>(p.numel), o.op);
          if (cuda) ctx->synchronize();
          auto t1 = std::chrono::steady_clock::now();
          if (it >= p.warmup) mine.push_back(std::chrono::duration<double>(t1 - t0).count());
        }
      }
      comm->check();
      comm.reset();  // before its context
    } catch (const std::exception& e) {
      {
        std::lock_guard lock(err_mtx);
        if (failure.empty())
          failure = "rank " + std::to_string(r) + " (" +
                    o.devices[static_cast<std::size_t>(r)].str() + "): " + e.what();
      }
      group->abort(e.what());
      barrier.brk();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  if (!failure.empty()) {
    err << "troupe bench allreduce --algorithm nccl: " << failure << "\n";
    return 1;
  }
  for (std::size_t s = 0; s < plans.size(); ++s) {
    // Per call, the slowest rank.
    std::vector<double> slowest(static_cast<std::size_t>(plans[s].iters), 0.0);
    for (const auto& per_rank : seconds[s])
      for (std::size_t i = 0; i < slowest.size(); ++i)
        slowest[i] = std::max(slowest[i], per_rank[i]);
    measurement m{algo, n, plans[s].bytes, median(slowest), 0.0};
    const double algbw = static_cast<double>(m.bytes) / m.seconds / 1e9;
    m.busbw_gbps = algbw * 2.0 * (n - 1) / n;
    results.push_back(m);
    if (o.json) {
      out << device_json_line(m, algbw, devices);
    } else {
      char line[256];
      std::snprintf(line, sizeof line, "%-13s %6s %12lld %13s %12.2f %12.2f\n", m.algorithm.c_str(),
                    human_bytes(m.bytes).c_str(), static_cast<long long>(plans[s].iters),
                    format_time(m.seconds).c_str(), algbw, m.busbw_gbps);
      out << line;
    }
    out << std::flush;
  }
  return 0;
}

// Where the MPI comparison runs from; why_not says why it cannot.
struct mpi_plan {
  std::string mpirun;
  std::string bench;
  std::string why_not;
};

bool executable(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

mpi_plan plan_mpi() {
  namespace fs = std::filesystem;
  mpi_plan p;
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    for (std::size_t a = 0; a <= dirs.size() && p.mpirun.empty();) {
      auto b = std::min(dirs.find(':', a), dirs.size());
      auto cand = fs::path(b > a ? dirs.substr(a, b - a) : ".") / "mpirun";
      if (executable(cand)) p.mpirun = cand.string();
      a = b + 1;
    }
  }
  if (p.mpirun.empty()) {
    p.why_not = "no mpirun on PATH (Debian: openmpi-bin)";
    return p;
  }
  if (const char* env = std::getenv("TROUPE_MPI_BENCH"); env && *env) {
    if (executable(env))
      p.bench = env;
    else
      p.why_not = std::string("TROUPE_MPI_BENCH=") + env + " is not an executable file";
    return p;
  }
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    p.why_not = "cannot read /proc/self/exe to find bench_mpi_allreduce: " + ec.message();
    return p;
  }
  // bench_allreduce sits next to it; troupe one level up, in build/<preset>/.
  for (auto cand : {self.parent_path() / "bench_mpi_allreduce",
                    self.parent_path() / "bench" / "bench_mpi_allreduce"})
    if (executable(cand)) {
      p.bench = cand.string();
      return p;
    }
  p.why_not = "no bench_mpi_allreduce in " + self.parent_path().string() + " or its bench/ " +
              "(built when CMake finds MPI: Debian libopenmpi-dev; or set TROUPE_MPI_BENCH)";
  return p;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs bench_mpi_allreduce under mpirun and reads its JSON lines. OpenMPI's
// flags for a root container on a few cores: root is refused without the two
// environment variables; more ranks than cores needs --oversubscribe (OpenMPI
// then yields instead of spinning while it waits); no pinning, so ranks are
// not stacked on one core; shared memory between the processes (vader). Its
// single-copy mechanism (CMA) needs ptrace rights; it works here, elsewhere
// OMPI_MCA_* variables in the environment pass through. `timeout` bounds a
// hung job.
int run_mpi(const bench_options& o, const mpi_plan& plan, std::vector<measurement>& results,
            std::ostream& err) {
  std::string sizes;
  for (int64_t b : o.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
  constexpr int timeout_s = 600;
  std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 10 " +
                    std::to_string(timeout_s) + " " + shell_quote(plan.mpirun) + " -n " +
                    std::to_string(o.replicas) +
                    " --oversubscribe --bind-to none --mca btl self,vader " +
                    shell_quote(plan.bench) + " --sizes " + sizes + " --op " + reduce_op_name(o.op);
  if (o.iterations) cmd += " --iterations " + std::to_string(o.iterations);
  const std::string what = "troupe bench allreduce: MPI comparison: `" + cmd + "`";
  // No stdin: mpirun forwards it to rank 0 and would wait on a terminal.
  FILE* pipe = ::popen((cmd + " </dev/null 2>&1").c_str(), "r");
  if (!pipe) {
    err << what << ": cannot start: " << std::strerror(errno) << "\n";
    return 1;
  }
  std::string output;
  std::vector<measurement> got;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) {
    std::string line = buf;
    auto j = nlohmann::json::parse(line, nullptr, false);
    try {
      if (j.is_object() && j.value("algorithm", "") == "mpi") {
        got.push_back({"mpi", j.at("replicas").get<int>(), j.at("bytes").get<int64_t>(),
                       j.at("seconds").get<double>(), j.at("busbw_gbps").get<double>()});
        continue;
      }
    } catch (const nlohmann::json::exception&) {
      // Not one of ours after all: shown with mpirun's other output.
    }
    output += line;
  }
  int ws = ::pclose(pipe);
  int rc = ws == -1 ? -1 : WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  std::string why;
  if (rc == 124 || rc == 137)
    why = "timed out after " + std::to_string(timeout_s) + " s";
  else if (rc != 0)
    why = "exit status " + std::to_string(rc);
  else if (got.size() != o.sizes.size())
    why = "printed " + std::to_string(got.size()) + " results for " +
          std::to_string(o.sizes.size()) + " sizes";
  if (!why.empty()) {
    err << what << " failed: " << why << "\n"
        << output
        << "(--mpi off skips the comparison; where ptrace is not allowed, OpenMPI's shared "
           "memory needs OMPI_MCA_btl_vader_single_copy_mechanism=none in the environment)\n";
    return 1;
  }
  // mpirun's own warnings, if any, belong to the user.
  err << output;
  results.insert(results.end(), got.begin(), got.end());
  return 0;
}

}  // namespace

int run_allreduce_bench(const std::vector<std::string>& args, std::ostream& out,
                        std::ostream& err) {
  bench_options o;
  try {
    for (std::size_t i = 0; i < args.size(); ++i) {
      const auto& a = args[i];
      auto value = [&]() -> const std::string& {
        if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
        return args[++i];
      };
      if (a == "--replicas") {
        o.replicas = std::stoi(value());
        o.replicas_given = true;
        if (o.replicas < 1) throw std::invalid_argument("--replicas must be >= 1");
      } else if (a == "--sizes") {
        o.sizes.clear();
        for (auto& s : split_list(value())) o.sizes.push_back(parse_size(s));
        if (o.sizes.empty()) throw std::invalid_argument("--sizes needs at least one size");
      } else if (a == "--algorithm") {
        auto v = value();
        o.device_collectives = false;
        if (v == "all") {
          o.algorithms = reducer_algorithms();
        } else if (v == "nccl") {
          o.device_collectives = true;
          o.algorithms = {"nccl"};
        } else {
          o.algorithms = split_list(v);
          for (auto& n : o.algorithms) {
            if (n == "nccl")
              throw std::invalid_argument(
                  "--algorithm nccl runs alone (its ranks are devices, not reducers)");
            if (std::find(reducer_algorithms().begin(), reducer_algorithms().end(), n) ==
                reducer_algorithms().end())
              throw std::invalid_argument("unknown algorithm '" + n +
                                          "' (known: ring, tree, reduce_to_one, all, nccl)");
          }
        }
      } else if (a == "--devices") {
        o.devices.clear();
        for (auto& d : split_list(value())) {
          device_spec spec;
          try {
            spec = parse_device(d);
          } catch (const device_error& e) {
            throw std::invalid_argument(std::string("--devices: ") + e.what());
          }
          if (std::find(o.devices.begin(), o.devices.end(), spec) != o.devices.end())
            throw std::invalid_argument("--devices: " + spec.str() + " appears twice");
          if (!o.devices.empty() && spec.kind != o.devices[0].kind)
            throw std::invalid_argument("--devices: all devices must be of one kind, not " +
                                        o.devices[0].str() + " and " + spec.str());
          o.devices.push_back(spec);
        }
        if (o.devices.empty()) throw std::invalid_argument("--devices needs at least one device");
      } else if (a == "--iterations") {
        o.iterations = std::stoll(value());
        if (o.iterations < 1) throw std::invalid_argument("--iterations must be >= 1");
      } else if (a == "--op") {
        o.op = parse_reduce_op(value());
      } else if (a == "--bucket-bytes") {
        o.reducer.bucket_bytes = parse_size(value());
      } else if (a == "--chunk-bytes") {
        o.reducer.chunk_bytes = parse_size(value());
      } else if (a == "--policy") {
        o.policy = value();
        if (o.policy != "sharing" && o.policy != "stealing")
          throw std::invalid_argument("--policy is sharing or stealing");
      } else if (a == "--threads") {
        o.threads = std::stoi(value());
        if (o.threads < 1) throw std::invalid_argument("--threads must be >= 1");
      } else if (a == "--json") {
        o.json = true;
      } else if (a == "--mpi") {
        o.mpi = value();
        if (o.mpi != "auto" && o.mpi != "off" && o.mpi != "on")
          throw std::invalid_argument("--mpi is auto, off or on, not '" + o.mpi + "'");
      } else {
        throw std::invalid_argument("unknown option '" + a + "'");
      }
    }
    if (!o.devices.empty() && !o.device_collectives)
      throw std::invalid_argument("--devices goes with --algorithm nccl");
    if (o.device_collectives) {
      if (o.op != reduce_op::sum && o.op != reduce_op::mean)
        throw std::invalid_argument(std::string("--algorithm nccl reduces with sum or mean, not ") +
                                    reduce_op_name(o.op));
      if (o.mpi == "on")
        throw std::invalid_argument(
            "--mpi on compares MPI with the reducer actors, not with --algorithm nccl");
      if (o.replicas_given && !o.devices.empty() &&
          o.replicas != static_cast<int>(o.devices.size()))
        throw std::invalid_argument("--replicas " + std::to_string(o.replicas) + " but " +
                                    std::to_string(o.devices.size()) + " --devices");
    }
  } catch (const std::exception& e) {
    return usage(err, e.what());
  }

  if (o.device_collectives) {
    if (int rc = plan_devices(o, err); rc != 0) return rc;
    const bool cuda = o.devices[0].kind == device_spec::kind_t::cuda;
    if (!o.json) {
      out << "all-reduce, " << o.devices.size() << " devices (" << device_list(o.devices)
          << "), op " << reduce_op_name(o.op) << ", float32, "
          << (cuda ? "NCCL on each device's compute stream, time to the synchronized result"
                   : "host emulation of the device collectives (not NCCL)")
          << "\n"
          << "algorithm      size    iterations   median time   algbw GB/s   busbw GB/s\n";
    }
    std::vector<measurement> results;
    return run_device_bench(o, results, out, err);
  }

  mpi_plan mpi;
  if (o.mpi != "off") {
    mpi = plan_mpi();
    // Asked for and impossible: say so before minutes of troupe's runs.
    if (o.mpi == "on" && !mpi.why_not.empty()) {
      err << "troupe bench allreduce: --mpi on: " << mpi.why_not << "\n";
      return 2;
    }
  }
  const int n = o.replicas;
  if (!o.json) {
    char head[160];
    std::snprintf(head, sizeof head,
                  "all-reduce, %d replicas, op %s, float32, %s scheduler, %zu threads\n", n,
                  reduce_op_name(o.op), o.policy.empty() ? "sharing" : o.policy.c_str(),
                  o.threads > 0 ? static_cast<size_t>(o.threads) : size_t{2});
    out << head;
    out << "algorithm      size    iterations   median time   busbw GB/s\n";
  }
  std::vector<measurement> troupe_results;
  int status = run_troupe(o, troupe_results, out, err);
  if (o.mpi == "off") return status;
  if (!mpi.why_not.empty()) {
    err << "MPI comparison skipped: " << mpi.why_not << "\n";
    return status;
  }
  out << std::flush;
  std::vector<measurement> mpi_results;
  if (run_mpi(o, mpi, mpi_results, err) != 0) return 1;
  for (const auto& m : mpi_results) {
    out << (o.json ? json_line(m) : table_row(m, iterations_for(o, m.bytes)));
  }
  if (o.json) return status;

  out << "mpi: MPI_Allreduce in " << n << " processes on shared memory (" << mpi.mpirun
      << "); same sizes, op, data and timing (slowest rank per call, median)\n";
  out << "\nper size, the fastest troupe algorithm vs MPI_Allreduce (x: MPI's time / troupe's):\n"
      << "  size   troupe        median time   busbw GB/s |     mpi time   busbw GB/s       x\n";
  for (const auto& m : mpi_results) {
    const measurement* best = nullptr;
    for (const auto& t : troupe_results)
      if (t.bytes == m.bytes && (!best || t.seconds < best->seconds)) best = &t;
    char line[256];
    if (best)
      std::snprintf(line, sizeof line, "%6s   %-13s %11s %12.2f | %12s %12.2f %7.2fx\n",
                    human_bytes(m.bytes).c_str(), best->algorithm.c_str(),
                    format_time(best->seconds).c_str(), best->busbw_gbps,
                    format_time(m.seconds).c_str(), m.busbw_gbps, m.seconds / best->seconds);
    else
      std::snprintf(line, sizeof line, "%6s   %-13s %11s %12s | %12s %12.2f\n",
                    human_bytes(m.bytes).c_str(), "(failed)", "-", "-",
                    format_time(m.seconds).c_str(), m.busbw_gbps);
    out << line;
  }
  return status;
}

}  // namespace troupe

#endif
