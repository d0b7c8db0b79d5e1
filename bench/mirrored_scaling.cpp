// Training throughput of mirrored with N replicas against one_device on the
// same model and global batch (the same code path as `troupe run`).
// Evaluation and checkpoints are excluded from the timings.
//
//   bench_mirrored_scaling [replicas=2] [epochs=1] [repeats=3] [batches=128,256,512]
//                          [shard_optimizer=1] [algorithm=ring] [gather=auto]
//                          [steps_per_execution=1]
//
// algorithm: strategy.reducer.algorithm (ring, tree, reduce_to_one, or nccl:
// the in-process device collectives on cpu devices); gather: data.gather;
// steps_per_execution: training.steps_per_execution, for both jobs.
//
// Beside the speedup, the machine's ceiling for it: the model's own steps
// (forward, backward, Adam) of one thread on the global batch against N
// threads at once on batch/N rows each, with no runtime, input or
// collectives (bench/compute_threads.hpp), and the fraction of that
// ceiling the run reached. On a machine of N cores the runtime's own work
// (input gathers, hand-overs, sums) shares the cores with the replicas,
// where one_device has them to itself. With the optimizer sharded, also
// the protocol's ceiling: the same threads as one group on the host
// collectives, ZeRO-1 as mirrored's device step does it, still without
// actors or input.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/compute_threads.hpp"
#include "kernels/cpu_kernels.hpp"
#include "runtime/job.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  int64_t replicas = argc > 1 ? std::atoll(argv[1]) : 2;
  int64_t epochs = argc > 2 ? std::atoll(argv[2]) : 1;
  int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  std::vector<int64_t> batches{128, 256, 512};
  if (argc > 4) {
    batches.clear();
    std::stringstream ss(argv[4]);
    for (std::string item; std::getline(ss, item, ',');) batches.push_back(std::stoll(item));
  }
  bool shard = argc > 5 ? std::atoi(argv[5]) != 0 : true;
  const std::string algorithm = argc > 6 ? argv[6] : "ring";
  const std::string gather = argc > 7 ? argv[7] : "auto";
  const int64_t per_execution = argc > 8 ? std::atoll(argv[8]) : 1;
  spdlog::set_level(spdlog::level::warn);
  kernels::init_cpu_kernels();
  for (int64_t batch : batches) {
    std::vector<double> one, mir;
    for (int r = 0; r < repeats; ++r) {
      auto c1 = bench::training_only_job("bench_mirrored", batch, epochs);
      c1.training.steps_per_execution = per_execution;
      one.push_back(run_job(c1)["samples_per_second"].get<double>());
      auto cm = bench::training_only_job("bench_mirrored", batch, epochs);
      cm.strategy.kind = "mirrored";
      cm.strategy.replicas = replicas;
      cm.strategy.check_replicas_every = -1;
      cm.strategy.shard_optimizer = shard;
      cm.strategy.reducer.algorithm = parse_reducer_algorithm(algorithm);
      cm.data.gather = gather;
      cm.training.steps_per_execution = per_execution;
      cm.devices.clear();
      for (int64_t i = 0; i < replicas; ++i) cm.devices.push_back("cpu:" + std::to_string(i));
      mir.push_back(run_job(cm)["samples_per_second"].get<double>());
    }
    double o = bench::median(one), m = bench::median(mir);
    const int ceiling_steps = static_cast<int>(std::clamp<int64_t>(40000 / batch, 10, 300));
    const double solo_ms = bench::run_threads(1, batch, ceiling_steps, true);
    const double side_ms = bench::run_threads(
        static_cast<int>(replicas), std::max<int64_t>(1, batch / replicas), ceiling_steps, true);
    const double ceiling = solo_ms / side_ms;
    const double group_ms = shard ? bench::run_threads(static_cast<int>(replicas),
                                                       std::max<int64_t>(1, batch / replicas),
                                                       ceiling_steps, true, true)
                                  : 0.0;
    std::printf("%s\n", nlohmann::json{{"bench", "mirrored_scaling"},
                                       {"model", "mlp 784-256-256-10"},
                                       {"optimizer", "adam"},
                                       {"global_batch", batch},
                                       {"replicas", replicas},
                                       {"shard_optimizer", shard},
                                       {"algorithm", algorithm},
                                       {"gather", gather},
                                       {"steps_per_execution", per_execution},
                                       {"one_device_samples_per_second", o},
                                       {"mirrored_samples_per_second", m},
                                       {"speedup", m / o},
                                       {"compute_ceiling", ceiling},
                                       {"of_ceiling", m / o / ceiling},
                                       {"protocol_ceiling", shard ? solo_ms / group_ms : 0.0}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  return 0;
}
