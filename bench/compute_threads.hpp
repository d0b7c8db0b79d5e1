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
#include "devices/device_communicator.hpp"
#include "devices/device_context.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"

namespace troupe::bench {

// Mirrored's ZeRO-1 update on the host collectives (the variables whose
// size the ranks divide are sharded, as strategies/mirrored_steps.cpp does).
inline void zero1_update(device_communicator& comm, std::vector<named_tensor>& vars,
                         std::vector<named_tensor>& grads, kernels::optimizer& opt) {
  const auto n = static_cast<int64_t>(comm.size());
  auto splits = [&](const named_tensor& v) { return v.value.numel() % n == 0; };
  std::vector<std::pair<int64_t, int64_t>> mine;
  int64_t at = 0;
  for (auto& g : grads) {
    const int64_t size = g.value.numel(), chunk = size / n;
    if (splits(g)) {
      comm.issue_reduce_scatter(g.value.f32(), static_cast<std::size_t>(chunk), reduce_op::sum);
      mine.emplace_back(at + comm.rank() * chunk, at + (comm.rank() + 1) * chunk);
    } else {
      comm.issue_all_reduce(g.value.f32(), static_cast<std::size_t>(size), reduce_op::sum);
      mine.emplace_back(at, at + size);
    }
    at += size;
  }
  comm.complete();
  opt.apply_ranges(vars, grads, mine);
  for (auto& v : vars)
    if (splits(v))
      comm.issue_all_gather(v.value.f32(), static_cast<std::size_t>(v.value.numel() / n));
  comm.complete();
}

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
      auto ctx = make_device_context(device_spec{device_spec::kind_t::cpu, t});
      auto comm = group ? group->join(t, *ctx) : nullptr;
      auto net = create_model(c.model, {784, 10}, c.seed);
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
        if (comm && update)
          zero1_update(*comm, net->variables(), grads, opt);
        else if (update)
          opt.apply(net->variables(), grads);
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
