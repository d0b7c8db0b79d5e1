// What a timeline trace costs: the same job run alternately untraced and
// traced (troupe run --trace), median samples/s of each and the ratio.
// Evaluation and checkpoints are excluded from the timings; the trace file is
// written after the timed part (at the job's end) and its size is reported.
//
//   bench_trace_overhead [strategy=mirrored] [replicas=2] [batch=128] [epochs=2] [repeats=5]
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "actors/job.hpp"
#include "bench/bench_common.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  std::string strategy = argc > 1 ? argv[1] : "mirrored";
  int64_t replicas = argc > 2 ? std::atoll(argv[2]) : 2;
  int64_t batch = argc > 3 ? std::atoll(argv[3]) : 128;
  int64_t epochs = argc > 4 ? std::atoll(argv[4]) : 2;
  int repeats = argc > 5 ? std::atoi(argv[5]) : 5;
  spdlog::set_level(spdlog::level::warn);

  auto c = bench::training_only_job("bench_trace_overhead", batch, epochs);
  c.strategy.kind = strategy;
  if (strategy != "one_device") {
    c.strategy.replicas = replicas;
    c.strategy.check_replicas_every = -1;
    c.devices.clear();
    for (int64_t i = 0; i < replicas; ++i) c.devices.push_back("cpu:" + std::to_string(i));
  }
  const std::string trace_path = "/tmp/troupe-bench_trace_overhead.trace.json";
  job_options traced_options;
  traced_options.trace_path = trace_path;
  auto samples_per_second = [&](const job_options& o) {
    return run_job(c, o)["samples_per_second"].get<double>();
  };
  // Consecutive runs of the same job alternate between slower and faster on
  // the development machine (whatever their options), so the order within a
  // pair alternates too, and the ratio is the geometric mean of the median
  // traced/untraced ratio of each order: the alternation cancels out.
  std::vector<double> plain, traced, plain_first, traced_first;
  for (int r = 0; r < repeats; ++r) {
    double p = 0, t = 0;
    if (r % 2 == 0) {
      p = samples_per_second({});
      t = samples_per_second(traced_options);
      plain_first.push_back(t / p);
    } else {
      t = samples_per_second(traced_options);
      p = samples_per_second({});
      traced_first.push_back(t / p);
    }
    plain.push_back(p);
    traced.push_back(t);
  }
  const double ratio = traced_first.empty()
                           ? bench::median(plain_first)
                           : std::sqrt(bench::median(plain_first) * bench::median(traced_first));
  const double p = bench::median(plain), t = bench::median(traced);
  std::printf("%s\n", nlohmann::json{{"bench", "trace_overhead"},
                                     {"model", "mlp 784-256-256-10"},
                                     {"strategy", strategy},
                                     {"replicas", strategy == "one_device" ? 1 : replicas},
                                     {"global_batch", batch},
                                     {"epochs", epochs},
                                     {"repeats", repeats},
                                     {"untraced_samples_per_second", p},
                                     {"traced_samples_per_second", t},
                                     {"traced_over_untraced", ratio},
                                     {"overhead_percent", (1.0 - ratio) * 100.0},
                                     {"trace_bytes", std::filesystem::file_size(trace_path)},
                                     {"untraced_runs", plain},
                                     {"traced_runs", traced}}
                          .dump()
                          .c_str());
  std::filesystem::remove(trace_path);
  return 0;
}
