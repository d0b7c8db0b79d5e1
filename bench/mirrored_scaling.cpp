// Training throughput of mirrored with N replicas against one_device on the
// same model and global batch (the same code path as `troupe run`).
// Evaluation and checkpoints are excluded from the timings.
//
//   bench_mirrored_scaling [replicas=2] [epochs=1] [repeats=3] [batches=128,256,512]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actors/job.hpp"

using namespace troupe;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

job_config base(int64_t batch, int64_t epochs) {
  job_config c;
  c.name = "bench_mirrored";
  c.model.hidden = {256, 256};
  c.optimizer.kind = "adam";
  c.data.batch_size = batch;
  c.training.epochs = epochs;
  c.training.eval_every_epochs = 0;
  c.checkpoint.save_at_end = false;
  c.logging.every_steps = 1000000;
  c.logging.output_dir = "/tmp/troupe-bench-mirrored";
  return c;
}

}  // namespace

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
  spdlog::set_level(spdlog::level::warn);
  for (int64_t batch : batches) {
    std::vector<double> one, mir;
    for (int r = 0; r < repeats; ++r) {
      auto c1 = base(batch, epochs);
      one.push_back(run_job(c1)["samples_per_second"].get<double>());
      auto cm = base(batch, epochs);
      cm.strategy.kind = "mirrored";
      cm.strategy.replicas = replicas;
      cm.strategy.check_replicas_every = -1;
      cm.devices.clear();
      for (int64_t i = 0; i < replicas; ++i) cm.devices.push_back("cpu:" + std::to_string(i));
      mir.push_back(run_job(cm)["samples_per_second"].get<double>());
    }
    double o = median(one), m = median(mir);
    std::printf("%s\n", nlohmann::json{{"bench", "mirrored_scaling"},
                                       {"model", "mlp 784-256-256-10"},
                                       {"optimizer", "adam"},
                                       {"global_batch", batch},
                                       {"replicas", replicas},
                                       {"one_device_samples_per_second", o},
                                       {"mirrored_samples_per_second", m},
                                       {"speedup", m / o}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  return 0;
}
