// All-reduce benchmark: median time per all-reduce and bus bandwidth
// (bytes / time * 2(n-1)/n, as nccl-tests) for each algorithm and size, with
// the actor system configuration every troupe process uses
// (actors/system_config.hpp). Used by `troupe bench allreduce ...` and by the
// standalone bench_allreduce (this file compiled with TROUPE_ALLREDUCE_MAIN).
//
//   bench_allreduce [--replicas N] [--sizes 8,64K,1M,16M,64M]
//                   [--algorithm ring|tree|reduce_to_one|all] [--iterations K] [--json]
//                   [--op mean] [--bucket-bytes B] [--chunk-bytes B]
//                   [--policy sharing|stealing] [--threads T]   (experiments only)
#include <iostream>
#include <string>
#include <vector>

#include "actors/reducer.hpp"

#ifdef TROUPE_ALLREDUCE_MAIN

int main(int argc, char** argv) {
  return troupe::run_allreduce_bench(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                                     std::cerr);
}

#else

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "actors/system_config.hpp"

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
};

int64_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  long long v = std::stoll(s, &pos);
  std::string unit = s.substr(pos);
  int64_t mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else if (unit == "K" || unit == "k" || unit == "KB" || unit == "KiB") {
    mult = int64_t{1} << 10;
  } else if (unit == "M" || unit == "MB" || unit == "MiB") {
    mult = int64_t{1} << 20;
  } else if (unit == "G" || unit == "GB" || unit == "GiB") {
    mult = int64_t{1} << 30;
  } else {
    throw std::invalid_argument("bad size '" + s + "' (examples: 8, 64K, 16M, 1G)");
  }
  if (v <= 0) throw std::invalid_argument("size '" + s + "' must be positive");
  return v * mult;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> r;
  std::size_t a = 0;
  while (a <= s.size()) {
    auto b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) r.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return r;
}

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
      << "         [--op sum|mean|min|max] [--bucket-bytes B] [--chunk-bytes B]\n"
      << "         [--policy sharing|stealing] [--threads T]\n";
  return 2;
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
        if (o.replicas < 1) throw std::invalid_argument("--replicas must be >= 1");
      } else if (a == "--sizes") {
        o.sizes.clear();
        for (auto& s : split(value())) o.sizes.push_back(parse_size(s));
        if (o.sizes.empty()) throw std::invalid_argument("--sizes needs at least one size");
      } else if (a == "--algorithm") {
        auto v = value();
        if (v == "all") {
          o.algorithms = reducer_algorithms();
        } else {
          o.algorithms = split(v);
          for (auto& n : o.algorithms)
            if (std::find(reducer_algorithms().begin(), reducer_algorithms().end(), n) ==
                reducer_algorithms().end())
              throw std::invalid_argument("unknown algorithm '" + n +
                                          "' (known: ring, tree, reduce_to_one, all)");
        }
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
      } else {
        throw std::invalid_argument("unknown option '" + a + "'");
      }
    }
  } catch (const std::exception& e) {
    return usage(err, e.what());
  }

  system_config cfg;
  if (!o.policy.empty())
    cfg.set("scheduler.policy",
            o.policy == "sharing" ? caf::atom("sharing") : caf::atom("stealing"));
  if (o.threads > 0) cfg.set("scheduler.max-threads", static_cast<size_t>(o.threads));
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
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
  int status = 0;
  for (const auto& algo : o.algorithms) {
    auto rc = o.reducer;
    rc.algorithm = algo;
    auto group = spawn_reducer_group(sys, n, rc);
    for (int64_t bytes : o.sizes) {
      int64_t numel = (bytes + 3) / 4;
      int64_t real_bytes = numel * 4;
      int64_t iters = o.iterations ? o.iterations
                                   : std::clamp<int64_t>((int64_t{1} << 30) / real_bytes, 20, 1000);
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
      double sec = median(times);
      double busbw = n > 1 ? static_cast<double>(real_bytes) / sec * 2.0 * (n - 1) / n / 1e9 : 0.0;
      char line[256];
      if (o.json) {
        std::snprintf(line, sizeof line,
                      "{\"algorithm\":\"%s\",\"replicas\":%d,\"bytes\":%lld,\"seconds\":%.9g,"
                      "\"busbw_gbps\":%.6g}\n",
                      algo.c_str(), n, static_cast<long long>(real_bytes), sec, busbw);
      } else {
        double us = sec * 1e6;
        char t[32];
        if (us < 1000)
          std::snprintf(t, sizeof t, "%.1f us", us);
        else
          std::snprintf(t, sizeof t, "%.3f ms", us / 1000);
        std::snprintf(line, sizeof line, "%-13s %6s %12lld %13s %12.2f\n", algo.c_str(),
                      human_bytes(real_bytes).c_str(), static_cast<long long>(iters), t, busbw);
      }
      out << line << std::flush;
    }
    for (auto& h : group) self->send_exit(h, caf::exit_reason::user_shutdown);
  }
  return status;
}

}  // namespace troupe

#endif
