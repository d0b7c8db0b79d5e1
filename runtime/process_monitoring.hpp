#pragma once
// The monitoring of one process of a job (logging.*, docs/monitoring.md):
// its /metrics endpoint, and where the coordinator runs, the sinks its
// metrics lines go to besides metrics.jsonl (TensorBoard event files, the
// endpoint's registry).
#include <caf/all.hpp>
#include <memory>
#include <string>

#include "actors/job_plan.hpp"
#include "config/job_config.hpp"
#include "monitoring/metrics_sink.hpp"
#include "monitoring/prometheus_exporter.hpp"
#include "monitoring/prometheus_registry.hpp"

namespace troupe {

class process_monitoring {
 public:
  // Serves /metrics when logging.metrics_port asks, labelled with `task`
  // ("chief:0"; "local" for troupe run), and writes the port to
  // <output_dir>/metrics_port (troupe node: metrics_port.<job>-<index>).
  // Throws job_error when it cannot listen. `sys` (its running actors are
  // exported) outlives this object.
  process_monitoring(const job_config& c, const std::string& output_dir, const std::string& task,
                     caf::actor_system& sys);
  ~process_monitoring();
  process_monitoring(const process_monitoring&) = delete;
  process_monitoring& operator=(const process_monitoring&) = delete;

  // The coordinator's sinks besides metrics.jsonl, for job_plan::metrics_sink:
  // TensorBoard (logging.tensorboard) and /metrics; null for neither. Throws
  // job_error when the TensorBoard directory cannot be written.
  std::shared_ptr<monitoring::metrics_sink> job_sinks(const job_plan& plan);

 private:
  std::shared_ptr<monitoring::prometheus_registry> registry_;
  std::unique_ptr<monitoring::prometheus_exporter> exporter_;
};

}  // namespace troupe
