#pragma once
// The examples' MLP trained on T threads at once, each with its own model
// and a fixed batch: no actors, no input pipeline, no collectives. What the
// model's own steps cost side by side (bench_compute_contention), and the
// ceiling a data-parallel run of the same model can reach on this machine
// (bench_mirrored_scaling).
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"

namespace troupe::bench {

// Median over the threads of ms per step (forward, backward and, with
// `update`, the optimizer's step) of `threads` threads at once, each on
// `batch` rows.
inline double run_threads(int threads, int64_t batch, int steps, bool update) {
  auto c = training_only_job("contention", batch, 1);
  std::vector<double> ms(threads);
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      auto net = create_model(c.model, {784, 10}, c.seed + t);
      kernels::optimizer opt(c.optimizer, steps);
      opt.init(net->variables());
      auto grads = net->make_gradients();
      tensor x({batch, 784});
      tensor y({batch}, dtype::i32);
      for (int64_t i = 0; i < x.numel(); ++i)
        x.data<float>()[i] = static_cast<float>(i % 255) / 255.f;
      for (int64_t i = 0; i < batch; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(i % 10);
      ++ready;
      while (ready.load() < threads) {
      }
      auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        net->train_batch(x, y, 1.0f / static_cast<float>(batch), grads);
        if (update) opt.apply(net->variables(), grads);
      }
      ms[t] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          steps;
    });
  }
  for (auto& th : ts) th.join();
  return median(ms);
}

}  // namespace troupe::bench
