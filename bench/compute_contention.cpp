// Is compute slower when two device threads run in one process? Runs the
// MLP's forward/backward (+ Adam) on T threads at once, each with its own
// model, and prints per-thread ms per step against one thread alone. No
// actors: this isolates BLAS/allocator/cache effects from the runtime.
//
//   bench_compute_contention [threads=2] [batch=128] [steps=300]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"

using namespace troupe;

namespace {

double run_threads(int threads, int64_t batch, int steps, bool update) {
  auto c = bench::training_only_job("contention", batch, 1);
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
  return bench::median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  int64_t batch = argc > 2 ? std::atoll(argv[2]) : 128;
  int steps = argc > 3 ? std::atoi(argv[3]) : 300;
  kernels::init_cpu_kernels();
  for (bool update : {false, true}) {
    double solo = run_threads(1, batch, steps, update);
    double many = run_threads(threads, batch, steps, update);
    std::printf(
        "{\"bench\":\"compute_contention\",\"batch\":%lld,\"update\":%s,\"threads\":%d,"
        "\"solo_ms\":%.3f,\"concurrent_ms\":%.3f,\"slowdown\":%.3f}\n",
        static_cast<long long>(batch), update ? "true" : "false", threads, solo, many, many / solo);
  }
  return 0;
}
