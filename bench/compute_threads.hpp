#pragma once
// The examples' MLP trained on T threads at once, each with its own model
// and a fixed batch: no actors, no input pipeline, and no collectives unless
// asked for (zero1). What the model's own steps cost side by side
// (bench_compute_contention), and the ceilings a data-parallel run of the
// same model can reach on this machine (bench_mirrored_scaling).
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"
#include "collectives/process_group.hpp"
#include "devices/device_context.hpp"
#include "kernels/cpu_isa.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"
#include "strategies/mirrored_steps.hpp"

namespace troupe::bench {

// One thread's replica of the MLP: its model, optimizer and gradients, a
// fixed batch of `batch` rows, and (in a group) its communicator.
struct bench_replica {
  std::shared_ptr<device_context> ctx;  // outlives cs, which joined the group with it
  compute_state cs;
  tensor x, y;
  bench_replica(const job_config& c, int64_t batch, int steps, int rank,
                const std::shared_ptr<group_rendezvous>& group)
      : ctx(make_device_context(device_spec{device_spec::kind_t::cpu, rank})),
        x({batch, 784}),
        y({batch}, dtype::i32) {
    if (group) cs.collectives = group->join(rank, *ctx);
    cs.net = create_model(c.model, {784, 10}, c.seed);
    cs.opt = std::make_unique<kernels::optimizer>(c.optimizer, steps);
    cs.opt->init(cs.net->variables());
    cs.grads = cs.net->make_gradients();
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(i % 255) / 255.f;
    for (int64_t i = 0; i < batch; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(i % 10);
  }
  void backward() { cs.net->train_batch(x, y, 1.0f / static_cast<float>(x.shape()[0]), cs.grads); }
};

// Runs body(t, start_together) on `threads` threads at once, each a device
// thread (denormals flushed); start_together() returns once every thread
// has called it.
template <class Body>
void on_threads(int threads, Body body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      kernels::flush_denormals_on_this_thread();
      body(t, [&] {
        ++ready;
        while (ready.load() < threads) {
        }
      });
    });
  for (auto& th : ts) th.join();
}

using clock_type = std::chrono::steady_clock;
inline double us_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
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
  auto group = zero1 ? make_device_rendezvous(threads, device_spec{}) : nullptr;
  on_threads(threads, [&](int t, auto start_together) {
    bench_replica r(c, batch, steps, t, group);
    auto& cs = r.cs;
    // mirrored's ZeRO-1 on cpu:N (strategies/mirrored_step.cpp): this
    // rank's chunks, as its device step updates them.
    const auto mine = group ? own_shard_ranges(cs, *cs.collectives) : element_ranges{};
    start_together();
    auto t0 = clock_type::now();
    for (int s = 0; s < steps; ++s) {
      r.backward();
      if (!update) continue;
      if (group) {
        reduce_scatter_gradients(cs, *cs.collectives, 0, cs.grads.size());
        cs.collectives->complete();
        cs.opt->apply_ranges(cs.net->variables(), cs.grads, mine);
        gather_variables(cs, *cs.collectives);
      } else {
        cs.opt->apply(cs.net->variables(), cs.grads);
      }
    }
    ms[t] = us_since(t0) / 1000.0 / steps;
  });
  return median(ms);
}

// Where a ZeRO-1 group's update goes, in us a step (median over the threads
// of each phase's mean): the reduce-scatter (each thread reads its chunks of
// the peers' gradients, hot in the peers' caches, and sums them), Adam on
// its chunks, the all-gather (its chunks written into the peers'
// variables). Each phase starts on every thread together (a one-float
// all-reduce before it), so waiting for a slower peer is not counted.
struct update_phases {
  double reduce_scatter_us = 0, update_us = 0, all_gather_us = 0;
};
inline update_phases zero1_update_phases(int threads, int64_t batch, int steps) {
  auto c = training_only_job("contention", batch, 1);
  std::vector<double> rs(threads), up(threads), ag(threads);
  auto group = make_device_rendezvous(threads, device_spec{});
  on_threads(threads, [&](int t, auto start_together) {
    bench_replica r(c, batch, steps, t, group);
    auto& cs = r.cs;
    auto& comm = *cs.collectives;
    const auto mine = own_shard_ranges(cs, comm);
    auto together = [&] {
      float one = 1.0f;
      comm.all_reduce(&one, 1, reduce_op::sum);
      return clock_type::now();
    };
    start_together();
    for (int s = 0; s < steps; ++s) {
      r.backward();
      auto t0 = together();
      reduce_scatter_gradients(cs, comm, 0, cs.grads.size());
      comm.complete();
      rs[t] += us_since(t0) / steps;
      t0 = together();
      cs.opt->apply_ranges(cs.net->variables(), cs.grads, mine);
      up[t] += us_since(t0) / steps;
      t0 = together();
      gather_variables(cs, comm);
      ag[t] += us_since(t0) / steps;
    }
  });
  return {median(rs), median(up), median(ag)};
}

}  // namespace troupe::bench
