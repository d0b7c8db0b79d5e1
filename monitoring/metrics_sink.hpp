#pragma once
// Where a job's metrics lines go. The coordinator writes every line (the
// JSON objects of metrics.jsonl: "step", "epoch", "train", "shard", ...)
// once, to a fan-out of sinks: the JSON-lines file, TensorBoard event files,
// the Prometheus registry. Sinks are called from the coordinator only, one
// line at a time.
#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::monitoring {

class metrics_sink {
 public:
  virtual ~metrics_sink() = default;
  // `step` is the job's completed updates when the line is written: the
  // step of a line that has no "step" of its own.
  virtual void write(const nlohmann::json& line, int64_t step) = 0;
};

class metrics_fanout final : public metrics_sink {
 public:
  void add(std::shared_ptr<metrics_sink> sink);
  bool empty() const { return sinks_.empty(); }
  void write(const nlohmann::json& line, int64_t step) override;

 private:
  std::vector<std::shared_ptr<metrics_sink>> sinks_;
};

}  // namespace troupe::monitoring
