#pragma once
// Shared by the training benchmarks: the job they time, and the median.
#include <algorithm>
#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace troupe::bench {

// MLP 784-256-256-10 with Adam on Fashion-MNIST, with evaluation, checkpoints
// and progress output off, so only training is timed.
inline job_config training_only_job(const std::string& name, int64_t batch, int64_t epochs) {
  job_config c;
  c.name = name;
  c.model.hidden = {256, 256};
  c.optimizer.kind = "adam";
  c.data.batch_size = batch;
  c.training.epochs = epochs;
  c.training.eval_every_epochs = 0;
  c.checkpoint.save_at_end = false;
  c.logging.every_steps = 1000000;
  c.logging.output_dir = "/tmp/troupe-" + name;
  return c;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace troupe::bench
