#pragma once
// The examples' MLP trained on T threads at once, each with its own model
// and a fixed batch: no actors, no input pipeline, and no collectives unless
// asked for (zero1). What the model's own steps cost side by side
// (bench_compute_contention), and the ceilings a data-parallel run of the
// same model can reach on this machine (bench_mirrored_scaling).
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"
#include "devices/device_communicator.hpp"
#include "devices/device_context.hpp"
#include "kernels/cpu_isa.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"
#include "strategies/mirrored_steps.hpp"

namespace troupe::bench {

// Median over the threads of ms per step (forward, backward and, with
// `update`, the optimizer's step) of `threads` threads at once, each on
// `batch` rows. With `zero1` (and `update`) the threads are one data-parallel
// group on the host collectives, as mirrored's device step is on cpu:N: the
// gradients reduce-scattered, each thread's chunks updated, the variables
// all-gathered; what the protocol itself costs without any actor.
inline double run_threads(int threads, int64_t batch, int steps, bool update, bool zero1 = false) {
  auto c = training_only_job("contention", batch, 1);
  std::vector<double> ms(threads);
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  auto group = zero1 ? make_device_collective_group(threads, device_spec{}) : nullptr;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      kernels::flush_denormals_on_this_thread();  // as a device thread does
      auto ctx = make_device_context(device_spec{device_spec::kind_t::cpu, t});
      auto comm = group ? group->join(t, *ctx) : nullptr;
      compute_state cs;
      cs.net = create_model(c.model, {784, 10}, c.seed);
      cs.opt = std::make_unique<kernels::optimizer>(c.optimizer, steps);
      cs.opt->init(cs.net->variables());
      cs.grads = cs.net->make_gradients();
      // mirrored's ZeRO-1 on cpu:N (strategies/mirrored_device.cpp): this
      // rank's chunks, as its device step updates them.
      const auto mine = comm ? device_shard_ranges(cs, *comm) : element_ranges{};
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
        cs.net->train_batch(x, y, 1.0f / static_cast<float>(batch), cs.grads);
        if (!update) continue;
        if (comm) {
          reduce_scatter_gradients(cs, *comm, 0, cs.grads.size());
          comm->complete();
          cs.opt->apply_ranges(cs.net->variables(), cs.grads, mine);
          gather_variables(cs, *comm);
        } else {
          cs.opt->apply(cs.net->variables(), cs.grads);
        }
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
