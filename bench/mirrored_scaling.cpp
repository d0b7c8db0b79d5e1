// Training throughput of mirrored with N replicas against one_device on the
// same model and global batch (the same code path as `troupe run`).
// Evaluation and checkpoints are excluded from the timings.
//
//   bench_mirrored_scaling [replicas=2] [epochs=1] [repeats=3] [batches=128,256,512]
//                          [shard_optimizer=1] [algorithm=ring] [gather=auto]
//
// algorithm: strategy.reducer.algorithm (ring, tree, reduce_to_one, or nccl:
// the in-process device collectives on cpu devices); gather: data.gather.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/bench_common.hpp"
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
  spdlog::set_level(spdlog::level::warn);
  for (int64_t batch : batches) {
    std::vector<double> one, mir;
    for (int r = 0; r < repeats; ++r) {
      auto c1 = bench::training_only_job("bench_mirrored", batch, epochs);
      one.push_back(run_job(c1)["samples_per_second"].get<double>());
      auto cm = bench::training_only_job("bench_mirrored", batch, epochs);
      cm.strategy.kind = "mirrored";
      cm.strategy.replicas = replicas;
      cm.strategy.check_replicas_every = -1;
      cm.strategy.shard_optimizer = shard;
      cm.strategy.reducer.algorithm = algorithm;
      cm.data.gather = gather;
      cm.devices.clear();
      for (int64_t i = 0; i < replicas; ++i) cm.devices.push_back("cpu:" + std::to_string(i));
      mir.push_back(run_job(cm)["samples_per_second"].get<double>());
    }
    double o = bench::median(one), m = bench::median(mir);
    std::printf("%s\n", nlohmann::json{{"bench", "mirrored_scaling"},
                                       {"model", "mlp 784-256-256-10"},
                                       {"optimizer", "adam"},
                                       {"global_batch", batch},
                                       {"replicas", replicas},
                                       {"shard_optimizer", shard},
                                       {"algorithm", algorithm},
                                       {"gather", gather},
                                       {"one_device_samples_per_second", o},
                                       {"mirrored_samples_per_second", m},
                                       {"speedup", m / o}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  return 0;
}
