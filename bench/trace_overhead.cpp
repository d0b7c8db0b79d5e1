// What a timeline trace costs: the same job run alternately untraced and
// traced (troupe run --trace), median samples/s of each and the ratio.
// Evaluation and checkpoints are excluded from the timings; the trace file is
// written after the timed part (at the job's end) and its size is reported.
// Beside the timings (which a shared machine makes noisy), the cost of one
// recorded event times the events per step, as a share of a step's time.
//
//   bench_trace_overhead [strategy=mirrored] [replicas=2] [batch=128] [epochs=2] [repeats=5]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/bench_common.hpp"
#include "runtime/job.hpp"
#include "trace/trace.hpp"

using namespace troupe;

namespace {

// Spans and counters in a trace file.
int64_t recorded_events(const std::string& path) {
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  int64_t n = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] != "M") ++n;
  return n;
}

// The hot path: an actor's state_track changing state (one clock read, one
// event appended to this thread's buffer), averaged over many.
double ns_per_event() {
  const std::string path = "/tmp/troupe-bench_trace_overhead.micro.json";
  constexpr int n = 200000;
  double ns = 0;
  {
    trace::session s(path, {"micro", "none", 0});
    trace::state_track track("micro");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) track.set(i % 2 ? "a" : "b", trace::category::compute);
    ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
        n;
  }
  std::filesystem::remove(path);
  return ns;
}

}  // namespace

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
  // the development machine (whatever their options), so which run of a pair
  // goes first alternates too: both medians see as many of each.
  std::vector<double> plain, traced;
  int64_t steps = 0;
  for (int r = 0; r < repeats; ++r) {
    if (r % 2 == 0) plain.push_back(samples_per_second({}));
    auto s = run_job(c, traced_options);
    traced.push_back(s["samples_per_second"].get<double>());
    steps = s["steps"].get<int64_t>();
    if (r % 2 == 1) plain.push_back(samples_per_second({}));
  }
  const double p = bench::median(plain), t = bench::median(traced);
  // What the timings cannot resolve on a noisy machine: the cost of one
  // recorded event times the events a step records, against a step's time.
  const double events = static_cast<double>(recorded_events(trace_path));
  const double per_event_ns = ns_per_event();
  const double step_us = static_cast<double>(batch) / p * 1e6;
  const double events_per_step = events / static_cast<double>(std::max<int64_t>(1, steps));
  std::printf("%s\n", nlohmann::json{{"bench", "trace_overhead"},
                                     {"model", "mlp 784-256-256-10"},
                                     {"strategy", strategy},
                                     {"replicas", strategy == "one_device" ? 1 : replicas},
                                     {"global_batch", batch},
                                     {"epochs", epochs},
                                     {"repeats", repeats},
                                     {"untraced_samples_per_second", p},
                                     {"traced_samples_per_second", t},
                                     {"traced_over_untraced", t / p},
                                     {"overhead_percent", (1.0 - t / p) * 100.0},
                                     {"events_per_step", events_per_step},
                                     {"ns_per_event", per_event_ns},
                                     {"step_us", step_us},
                                     {"recording_percent_of_step",
                                      events_per_step * per_event_ns / 1000.0 / step_us * 100.0},
                                     {"trace_bytes", std::filesystem::file_size(trace_path)},
                                     {"untraced_runs", plain},
                                     {"traced_runs", traced}}
                          .dump()
                          .c_str());
  std::filesystem::remove(trace_path);
  return 0;
}
