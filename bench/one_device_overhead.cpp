// Overhead of the actor runtime on one device: samples/s of a one_device job
// (the same code path as `troupe run`) against a plain loop that calls the
// same kernels with no actors. Both train the same model on the same data in
// the same order; evaluation and checkpoints are excluded from both timings.
//
//   bench_one_device_overhead [epochs=2] [repeats=3] [batch=128]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "actors/input_pipeline.hpp"
#include "bench/bench_common.hpp"
#include "data/dataset.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"
#include "runtime/job.hpp"

using namespace troupe;

namespace {

double plain_loop(const job_config& c, const data::train_test& tt) {
  const auto& d = tt.train;
  auto net = create_model(c.model, {d.features(), d.classes}, c.seed);
  int64_t per_epoch = batches_per_epoch(d.size(), c.data.batch_size);
  int64_t total = per_epoch * c.training.epochs;
  kernels::optimizer opt(c.optimizer, total);
  opt.init(net->variables());
  auto grads = net->make_gradients();
  tensor x, y;
  int64_t samples = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t e = 0; e < c.training.epochs; ++e) {
    auto order = data::epoch_order(d.size(), c.seed, e, c.data.shuffle);
    for (int64_t b = 0; b < per_epoch; ++b) {
      int64_t begin = b * c.data.batch_size;
      int64_t end = std::min(d.size(), begin + c.data.batch_size);
      data::gather_batch(d, {order.data() + begin, static_cast<std::size_t>(end - begin)}, x, y);
      net->train_batch(x, y, 1.0f / static_cast<float>(end - begin), grads);
      opt.apply(net->variables(), grads);
      samples += end - begin;
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(samples) / s;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t epochs = argc > 1 ? std::atoll(argv[1]) : 2;
  int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  int64_t batch = argc > 3 ? std::atoll(argv[3]) : 128;
  spdlog::set_level(spdlog::level::warn);
  kernels::init_cpu_kernels();

  auto c = bench::training_only_job("bench_one_device", batch, epochs);
  auto tt = data::load_fashion_mnist(c.data);

  std::vector<double> plain, actors;
  for (int r = 0; r < repeats; ++r) {
    plain.push_back(plain_loop(c, tt));
    auto s = run_job(c);
    actors.push_back(s["samples_per_second"].get<double>());
    std::printf("%s\n", nlohmann::json{{"repeat", r},
                                       {"plain_samples_per_second", plain.back()},
                                       {"troupe_samples_per_second", actors.back()}}
                            .dump()
                            .c_str());
  }
  double p = bench::median(plain), a = bench::median(actors);
  double overhead = (p - a) / p * 100.0;
  std::printf("%s\n", nlohmann::json{{"bench", "one_device_overhead"},
                                     {"model", "mlp 784-256-256-10"},
                                     {"optimizer", "adam"},
                                     {"batch", batch},
                                     {"epochs", epochs},
                                     {"repeats", repeats},
                                     {"plain_samples_per_second_median", p},
                                     {"troupe_samples_per_second_median", a},
                                     {"overhead_percent", overhead}}
                          .dump()
                          .c_str());
  return 0;
}
