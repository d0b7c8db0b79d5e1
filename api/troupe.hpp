// troupe's public C++ API (installed as <troupe/troupe.hpp>).
//
// Two ways to use troupe from a program:
//  1. Jobs: a job_config (from a JSON file, a JSON value, or filled in code)
//     run by run_job() with any strategy, exactly as `troupe run` does;
//     metrics arrive through job_options' callbacks and the returned summary.
//     register_model() / register_env() add a program's own model or RL
//     environment, which a config can then name (model.kind, rl.env).
//  2. A custom training loop, as tf.distribute's strategy.run/reduce and
//     experimental_distribute_dataset, or a DDP loop written by hand: a
//     `replica_group` owns N replicas, each on its own device thread, and
//     runs the program's step function on all of them at once; inside it,
//     replica_context::all_reduce reduces tensors across the replicas
//     through troupe's reducers (ring, tree, reduce_to_one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "actors/job_options.hpp"  // job_options, progress_info, job_error
#include "config/job_config.hpp"   // job_config, load_job_config, parse_job_config
#include "data/dataset.hpp"        // data::dataset, load_data, load_fashion_mnist
#include "envs/env.hpp"            // register_env
#include "kernels/optimizer.hpp"   // kernels::optimizer
#include "messages/reduce_op.hpp"  // reduce_op
#include "messages/tensor.hpp"     // tensor, named_tensor
#include "models/model.hpp"        // model, register_model, create_model
#include "runtime/job.hpp"         // run_job

namespace troupe {

// A step function threw on replica `replica`; what() is "replica R: <its what()>".
class replica_error : public std::runtime_error {
 public:
  replica_error(int replica, const std::string& what)
      : std::runtime_error("replica " + std::to_string(replica) + ": " + what), replica_(replica) {}
  int replica() const noexcept { return replica_; }

 private:
  int replica_;
};

class replica_group;

// What a step function sees of its replica.
class replica_context {
 public:
  int replica_id() const noexcept { return id_; }
  int num_replicas() const noexcept { return replicas_; }
  // All-reduce across the replicas, in place: every replica calls it with
  // tensors of the same shapes, in the same order of calls. sum or mean
  // (min, max too). Throws std::runtime_error when a peer failed.
  void all_reduce(std::vector<tensor>& tensors, reduce_op op);
  void all_reduce(std::vector<named_tensor>& tensors, reduce_op op);
  double all_reduce(double value, reduce_op op);

 private:
  friend class replica_group;
  replica_context(replica_group& g, int id, int replicas)
      : owner_(&g), id_(id), replicas_(replicas) {}
  replica_group* owner_;
  int id_, replicas_;
};

// N replicas, each on its own device thread (cpu:0..N-1), with a reducer
// group: what tf.distribute calls a strategy (troupe's strategies are the
// job-level protocols that strategy.kind names).
class replica_group {
 public:
  // One replica.
  static replica_group one_device();
  // `replicas` replicas (0: one per CPU core this process may use, as
  // strategy.replicas "auto"); `algorithm`: ring | tree | reduce_to_one.
  static replica_group mirrored(int replicas = 0, const std::string& algorithm = "ring");

  replica_group(replica_group&&) noexcept;
  replica_group& operator=(replica_group&&) noexcept;
  ~replica_group();

  int num_replicas() const noexcept;

  // tf.distribute's strategy.run: calls fn(ctx) on every replica at once,
  // each on its own device thread, and returns the per-replica results in
  // replica order.
  // When a replica throws, its peers' collectives fail too (nobody waits for
  // ever) and run() throws replica_error naming the first replica that threw.
  template <class F>
  auto run(F&& fn) {
    using R = std::invoke_result_t<F&, replica_context&>;
    if constexpr (std::is_void_v<R>) {
      run_erased([&](replica_context& c) { fn(c); });
    } else {
      std::vector<R> out(static_cast<std::size_t>(num_replicas()));
      run_erased(
          [&](replica_context& c) { out[static_cast<std::size_t>(c.replica_id())] = fn(c); });
      return out;
    }
  }

  // tf.distribute's strategy.reduce: per-replica values reduced to one
  // (sum, mean, min, max).
  static double reduce(reduce_op op, const std::vector<double>& per_replica);

 private:
  friend class replica_context;
  struct impl;
  explicit replica_group(std::unique_ptr<impl> p);
  void run_erased(const std::function<void(replica_context&)>& fn);
  std::unique_ptr<impl> impl_;
};

// experimental_distribute_dataset: the epochs of a dataset cut into global
// batches (shuffled per epoch from `seed`, the same order as troupe's own
// input pipelines) and each global batch split across the replicas, the
// first B % N replicas taking one example more.
class distributed_dataset {
 public:
  distributed_dataset(const data::dataset& d, int64_t global_batch, int replicas, uint64_t seed,
                      bool shuffle = true);
  // Global batches per epoch (the last one may be partial).
  int64_t steps_per_epoch() const noexcept;
  // Replica r's part of global batch `step` of `epoch`: x [b, F] float32,
  // y [b] int32 (buffers reused when their shape fits).
  void batch(int64_t epoch, int64_t step, int replica, tensor& x, tensor& y) const;
  // The examples in replica r's part of that batch.
  int64_t rows(int64_t epoch, int64_t step, int replica) const;

 private:
  const data::dataset* data_;
  int64_t global_batch_;
  int replicas_;
  uint64_t seed_;
  bool shuffle_;
  // The current epoch's order, shared by the replicas' threads.
  mutable std::mutex mu_;
  mutable std::vector<int64_t> order_;
  mutable int64_t order_epoch_ = -1;
  std::vector<int64_t> slice(int64_t epoch, int64_t step, int replica) const;
};

}  // namespace troupe
