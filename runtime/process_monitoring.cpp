#include "runtime/process_monitoring.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "monitoring/output_file.hpp"
#include "monitoring/prometheus_sink.hpp"
#include "monitoring/tensorboard_sink.hpp"
#include "monitoring/tensorboard_writer.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRunningActors = "troupe_actors_running";

std::string port_file_name(const std::string& task) {
  if (task == "local") return "metrics_port";
  std::string name = "metrics_port." + task;
  for (char& ch : name)
    if (ch == ':') ch = '-';
  return name;
}

// Where a test or a script finds a port the OS picked; a failure costs only
// the file. Never written through a planted symbolic or hard link.
void write_port_file(const std::string& output_dir, const std::string& task, uint16_t port) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  const auto path = fs::path(output_dir) / port_file_name(task);
  try {
    monitoring::write_output_file(path.string(), std::to_string(port) + "\n");
  } catch (const monitoring::output_file_error& e) {
    spdlog::warn("cannot write the port file {}", e.what());
  }
}

void export_process_figures(monitoring::prometheus_registry& r, caf::actor_system& sys) {
  r.set("troupe_up", monitoring::metric_kind::gauge,
        "1 while this troupe process serves /metrics (its liveness)", {}, 1);
  r.set("troupe_start_time_seconds", monitoring::metric_kind::gauge,
        "when this process started serving /metrics, in seconds since the Unix epoch", {},
        monitoring::unix_seconds_now());
  // The registry's count is an atomic: safe to read from the exporter's thread.
  r.set_callback(kRunningActors, monitoring::metric_kind::gauge, "actors running in this process",
                 [&sys] { return static_cast<double>(sys.registry().running()); });
}

}  // namespace

process_monitoring::process_monitoring(const job_config& c, const std::string& output_dir,
                                       const std::string& task, caf::actor_system& sys) {
  const auto& l = c.logging;
  if (l.metrics_port == 0) return;
  registry_ = std::make_shared<monitoring::prometheus_registry>(
      monitoring::metric_labels{{"troupe_job", c.name}, {"task", task}});
  export_process_figures(*registry_, sys);
  monitoring::exporter_options o;
  o.address = l.metrics_address;
  o.port = l.metrics_port == logging_config::kMetricsPortAuto
               ? 0
               : static_cast<uint16_t>(l.metrics_port);
  try {
    exporter_ = std::make_unique<monitoring::prometheus_exporter>(registry_, o);
  } catch (const monitoring::exporter_error& e) {
    throw job_error("logging.metrics_port: " + std::string(e.what()));
  }
  spdlog::info("serving /metrics on {} (outside the cluster gate)", exporter_->endpoint());
  write_port_file(output_dir, task, exporter_->port());
}

process_monitoring::~process_monitoring() {
  exporter_.reset();  // its thread reads the registry's callbacks: stopped first
  if (registry_) registry_->remove_callback(kRunningActors);
}

std::shared_ptr<monitoring::metrics_sink> process_monitoring::job_sinks(const job_plan& plan) {
  const auto& l = plan.config.logging;
  auto sinks = std::make_shared<monitoring::metrics_fanout>();
  if (l.tensorboard) {
    const std::string dir = l.tensorboard_dir.empty()
                                ? (fs::path(plan.output_dir) / "tensorboard").string()
                                : l.tensorboard_dir;
    try {
      sinks->add(std::make_shared<monitoring::tensorboard_sink>(dir, !plan.resume_from));
    } catch (const monitoring::tensorboard_error& e) {
      throw job_error(std::string("logging.tensorboard: ") + e.what());
    }
  }
  if (registry_) sinks->add(std::make_shared<monitoring::prometheus_sink>(registry_));
  if (sinks->empty()) return nullptr;
  return sinks;
}

}  // namespace troupe
