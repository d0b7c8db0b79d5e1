#pragma once
// Metrics lines as the latest values of /metrics: every number of a line of
// type T becomes troupe_T_<field> ("troupe_step_loss",
// "troupe_epoch_test_accuracy", "troupe_train_queue_depth",
// "troupe_shard_staleness_mean{shard="0"}"), a gauge, or a counter named
// ..._total for the running totals (pushes, bytes, env steps, episodes);
// troupe_step is the job's step, troupe_metrics_lines_total{type} counts
// the lines.
#include <memory>

#include "monitoring/metrics_sink.hpp"
#include "monitoring/prometheus_registry.hpp"

namespace troupe::monitoring {

class prometheus_sink final : public metrics_sink {
 public:
  explicit prometheus_sink(std::shared_ptr<prometheus_registry> registry);
  void write(const nlohmann::json& line, int64_t step) override;

 private:
  std::shared_ptr<prometheus_registry> registry_;
};

}  // namespace troupe::monitoring
