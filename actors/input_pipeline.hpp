#pragma once
#include <memory>

#include "data/dataset.hpp"
#include "devices/device.hpp"
#include "messages/protocols.hpp"

namespace troupe {

// Which part of the input this pipeline produces (tf.distribute's InputContext).
struct input_context {
  int64_t num_input_pipelines = 1;
  int64_t input_pipeline_id = 0;
  int64_t num_replicas_in_sync = 1;
};

struct input_pipeline_config {
  std::shared_ptr<const data::dataset> data;
  int64_t global_batch = 128;    // examples per micro-batch, all replicas
  int64_t steps_per_update = 1;  // micro-batches per update (gradient accumulation)
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t prefetch = 2;
  input_context context;
  int64_t replica = 0;      // which slice of the global batch this pipeline serves
  int64_t start_epoch = 0;  // resume position
  int64_t start_index = 0;
  // Where the rows are gathered: null, on the pipeline's own (scheduler)
  // thread; else as tasks on this device, queued behind the replica's work.
  // A synchronous replica's device is idle between its gradients and the
  // collective's result, and the gather fills that gap instead of taking a
  // core from a computing replica (see data.gather in config/job_config.hpp).
  std::shared_ptr<cpu_device> gather_device;
  // Or none of that: the batch leaves with its rows still to copy, and the
  // replica's step copies them on its device (data.gather "step";
  // batch::fill_rows).
  bool gather_in_step = false;
};

// Number of updates per epoch, each of global_batch * steps_per_update
// examples: the last, partial one is kept.
int64_t batches_per_epoch(int64_t examples, int64_t global_batch, int64_t steps_per_update = 1);

// [begin, end) of replica r's slice of a global batch of n examples over k
// replicas: the first n % k replicas take one example more.
std::pair<int64_t, int64_t> replica_slice(int64_t n, int64_t k, int64_t r);

input_pipeline_actor::behavior_type input_pipeline(input_pipeline_actor::pointer self,
                                                   input_pipeline_config cfg);

}  // namespace troupe
