// What a step's per-layer collectives cost on the host device group
// (collectives/host_group.cpp) when the ranks' compute jitters, as it does
// on a shared machine: plain calls (each a rendezvous of the ranks) against
// issued ones (issue_*, one complete() before the update and one after the
// gather). The step is the mirrored ZeRO-1 step's shape on the examples'
// MLP: backward as 6 slices of busy work, each followed by a reduce-scatter
// of its variable's gradient, then the update's work, then an all-gather
// per variable. No model and no actors: the protocol alone.
//
//   bench_collective_overlap [ranks=2] [steps=2000] [step_us=400] [jitter=0.3] [repeats=5]
//
// jitter: each slice of work takes step_us/7 * (1 + jitter * u), u uniform
// in [0, 1), drawn per rank and slice. Prints, per mode, the median over the
// repeats of us per step and of the step's overhead over the slowest rank's
// work, as JSON lines.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"
#include "collectives/process_group.hpp"
#include "devices/device_context.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

// The MLP 784-256-256-10's variables, in backward's order.
const std::vector<std::size_t> variable_sizes{10, 2560, 256, 65536, 256, 200704};

void busy_for(double us) {
  const auto until = clock_type::now() + std::chrono::nanoseconds(static_cast<int64_t>(us * 1e3));
  while (clock_type::now() < until) {
  }
}

struct run_figures {
  double us_per_step = 0, overhead_us = 0;
};

run_figures run(int ranks, int steps, double step_us, double jitter, bool issued) {
  auto group = make_device_rendezvous(ranks, device_spec{device_spec::kind_t::cpu, 0});
  std::vector<double> work_us(static_cast<std::size_t>(ranks), 0.0);
  std::vector<std::vector<double>> slice_us(static_cast<std::size_t>(ranks));
  // Drawn beforehand, so every mode sees the same work.
  for (int r = 0; r < ranks; ++r) {
    std::mt19937 rng(static_cast<unsigned>(1234 + r));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int i = 0; i < steps * 7; ++i)
      slice_us[static_cast<std::size_t>(r)].push_back(step_us / 7 * (1 + jitter * u(rng)));
  }
  double slowest_work = 0;
  for (int s = 0; s < steps; ++s) {
    double m = 0;
    for (int r = 0; r < ranks; ++r) {
      double w = 0;
      for (int k = 0; k < 7; ++k) w += slice_us[static_cast<std::size_t>(r)][s * 7 + k];
      m = std::max(m, w);
    }
    slowest_work += m;
  }
  const auto start = clock_type::now();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      auto ctx = make_device_context(device_spec{device_spec::kind_t::cpu, r});
      auto comm = group->join(r, *ctx);
      std::vector<std::vector<float>> grads, vars;
      for (auto n : variable_sizes) {
        grads.emplace_back(n, 1.0f);
        vars.emplace_back(n, 0.5f);
      }
      const auto& work = slice_us[static_cast<std::size_t>(r)];
      auto chunk = [&](std::size_t v) {
        return variable_sizes[v] / static_cast<std::size_t>(ranks);
      };
      for (int s = 0; s < steps; ++s) {
        for (std::size_t v = 0; v < variable_sizes.size(); ++v) {
          busy_for(work[static_cast<std::size_t>(s * 7) + v]);
          if (issued)
            comm->issue_reduce_scatter(grads[v].data(), chunk(v), reduce_op::sum);
          else
            comm->reduce_scatter(grads[v].data(), chunk(v), reduce_op::sum);
        }
        comm->complete();
        busy_for(work[static_cast<std::size_t>(s * 7) + 6]);  // the update
        for (std::size_t v = 0; v < variable_sizes.size(); ++v) {
          if (issued)
            comm->issue_all_gather(vars[v].data(), chunk(v));
          else
            comm->all_gather(vars[v].data(), chunk(v));
        }
        comm->complete();
      }
    });
  for (auto& t : threads) t.join();
  const double total = std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
  return {total / steps, (total - slowest_work) / steps};
}

}  // namespace

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 2000;
  const double step_us = argc > 3 ? std::atof(argv[3]) : 400;
  const double jitter = argc > 4 ? std::atof(argv[4]) : 0.3;
  const int repeats = argc > 5 ? std::atoi(argv[5]) : 5;
  if (ranks < 1 || steps < 1 || step_us <= 0 || jitter < 0 || repeats < 1) {
    std::fprintf(stderr,
                 "usage: bench_collective_overlap [ranks>=1] [steps>=1] [step_us>0] [jitter>=0] "
                 "[repeats>=1]\n");
    return 2;
  }
  for (bool issued : {false, true}) {
    std::vector<double> per_step, overhead;
    for (int i = 0; i < repeats; ++i) {
      auto f = run(ranks, steps, step_us, jitter, issued);
      per_step.push_back(f.us_per_step);
      overhead.push_back(f.overhead_us);
    }
    std::printf("%s\n", nlohmann::json{{"bench", "collective_overlap"},
                                       {"mode", issued ? "issued" : "plain"},
                                       {"ranks", ranks},
                                       {"step_us", step_us},
                                       {"jitter", jitter},
                                       {"us_per_step", bench::median(per_step)},
                                       {"overhead_us", bench::median(overhead)}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  return 0;
}
