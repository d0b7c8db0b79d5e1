#pragma once
// Metrics lines as TensorBoard scalars: one run directory per role under
// the job's TensorBoard directory ("job" for the coordinator's own lines:
// loss, learning rate, samples/s, accuracies, returns, policy lag;
// "shard_<i>", "worker_<i>", "actor_<i>" for the lines about one of them),
// each scalar tagged "<line type>/<field>" ("step/loss",
// "epoch/test_accuracy", "shard/staleness_mean") at the line's step.
#include <map>
#include <memory>
#include <string>

#include "monitoring/metrics_sink.hpp"
#include "monitoring/tensorboard_writer.hpp"

namespace troupe::monitoring {

class tensorboard_sink final : public metrics_sink {
 public:
  // fresh: a new run (not a resumed one) first removes the event files an
  // earlier run left in `dir`'s run directories, as it starts metrics.jsonl
  // afresh. Opens the "job" run at once: throws tensorboard_error when
  // `dir` cannot be written.
  tensorboard_sink(std::string dir, bool fresh);
  void write(const nlohmann::json& line, int64_t step) override;

 private:
  tensorboard_writer* writer_for(const std::string& run);

  std::string dir_;
  std::map<std::string, std::unique_ptr<tensorboard_writer>> writers_;
  bool warned_ = false;  // a failed write is logged once
};

}  // namespace troupe::monitoring
