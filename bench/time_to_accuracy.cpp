// Wall time to a test accuracy for mirrored, asynchronous parameter_server
// and elastic averaging (EASGD), 4 workers, the same model, data and
// optimizer, plus the bytes each worker sends and receives per step.
//
//   bench_time_to_accuracy [target=0.89] [max_epochs=16]
//
// Evaluation runs after every epoch; the wall time includes it, alike for all.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/bench_common.hpp"
#include "runtime/job.hpp"

using namespace troupe;

namespace {

struct outcome {
  double seconds_to_target = -1;
  int64_t epoch_at_target = -1;
  double final_accuracy = 0;
  double bytes_per_worker_step = 0;
};

constexpr double model_bytes = 4.0 * (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);

outcome run(job_config c, double target) {
  outcome o;
  auto t0 = std::chrono::steady_clock::now();
  job_options opts;
  opts.on_epoch = [&](const nlohmann::json& line) {
    if (o.seconds_to_target < 0 && line.contains("test_accuracy") &&
        line["test_accuracy"].get<double>() >= target) {
      o.seconds_to_target =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      o.epoch_at_target = line["epoch"].get<int64_t>() + 1;
    }
  };
  opts.overwrite = true;
  auto s = run_job(c, opts);
  o.final_accuracy = s["test_accuracy"].get<double>();
  const double steps = s["steps"].get<double>();
  const double workers = static_cast<double>(c.strategy.replicas);
  if (c.strategy.kind == "mirrored") {
    // A ring moves 2 (n-1)/n of the gradients out of (and into) each replica per step.
    o.bytes_per_worker_step = 2.0 * 2.0 * (workers - 1) / workers * model_bytes;
  } else {
    // Measured at the shards: everything pushed to and pulled from them.
    std::ifstream in(s["output_dir"].get<std::string>() + "/metrics.jsonl");
    std::map<int64_t, double> bytes;  // latest per shard
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["type"] == "shard")
        bytes[j["shard"].get<int64_t>()] =
            j["bytes_in"].get<double>() + j["bytes_out"].get<double>();
    }
    double total = 0;
    for (auto& [_, b] : bytes) total += b;
    o.bytes_per_worker_step = total / steps;  // every step is one worker's
  }
  return o;
}

job_config base(const std::string& kind, int64_t epochs) {
  auto c = bench::training_only_job("tta_" + kind, 128, epochs);
  c.training.eval_every_epochs = 1;
  c.optimizer.schedule.kind = "cosine";
  c.optimizer.schedule.min_lr = 0.00005;
  c.strategy.kind = kind;
  c.strategy.replicas = 4;
  c.devices = {"cpu:0", "cpu:1", "cpu:2", "cpu:3"};
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  double target = argc > 1 ? std::atof(argv[1]) : 0.89;
  int64_t epochs = argc > 2 ? std::atoll(argv[2]) : 16;
  spdlog::set_level(spdlog::level::warn);
  std::vector<std::pair<std::string, job_config>> jobs;
  auto mirrored = base("mirrored", epochs);  // global batch 128 over 4 replicas
  mirrored.strategy.check_replicas_every = -1;
  jobs.emplace_back("mirrored", mirrored);
  auto ps = base("parameter_server", epochs);
  ps.data.batch_size = 32;  // per worker: 4 x 32 = 128 per round
  ps.strategy.shards = 2;
  ps.strategy.partitioner.kind = "greedy_bytes";
  ps.strategy.max_staleness = 4;
  jobs.emplace_back("parameter_server", ps);
  auto ea = base("elastic_average", epochs);
  ea.data.batch_size = 32;
  ea.strategy.communication_period = 8;
  ea.strategy.moving_rate = 0.225;
  jobs.emplace_back("elastic_average", ea);
  auto eas = ea;
  eas.strategy.synchronous = true;
  eas.logging.output_dir += "_sync";
  jobs.emplace_back("elastic_average_sync", eas);
  for (auto& [name, c] : jobs) {
    auto o = run(c, target);
    std::printf("%s\n", nlohmann::json{{"bench", "time_to_accuracy"},
                                       {"strategy", name},
                                       {"workers", 4},
                                       {"target", target},
                                       {"seconds_to_target", o.seconds_to_target},
                                       {"epoch_at_target", o.epoch_at_target},
                                       {"final_test_accuracy", o.final_accuracy},
                                       {"bytes_per_worker_step", o.bytes_per_worker_step}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  return 0;
}
