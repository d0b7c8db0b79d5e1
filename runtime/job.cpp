#include "runtime/job.hpp"
#include "runtime/job_trace.hpp"

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "actors/system_config.hpp"
#include "devices/device_context.hpp"
#include "kernels/cpu_kernels.hpp"
#include "runtime/coordinator.hpp"
#include "runtime/process_monitoring.hpp"
#include "runtime/topology.hpp"
#include "strategies/strategy.hpp"
#include "trace/trace.hpp"

namespace troupe {

namespace fs = std::filesystem;

void start_trace(std::optional<trace::session>& tracing, const job_config& c,
                 const job_options& o) {
  if (o.trace_path.empty()) return;
  try {
    tracing.emplace(o.trace_path, trace::job_info{c.name, c.strategy.kind, c.strategy.replicas});
  } catch (const trace::trace_error& e) {
    throw job_error(e.what());
  }
}

void finish_trace(std::optional<trace::session>& tracing, nlohmann::json& summary) {
  if (!tracing) return;
  try {
    tracing->finish();
  } catch (const trace::trace_error& e) {
    throw job_error(e.what());
  }
  // Absolute: troupe report finds the trace from the summary wherever it runs.
  summary["trace"] = fs::absolute(tracing->path()).string();
  spdlog::info("trace: {}", tracing->path());
}

bool has_convolutions(const model_config& m) {
  if (!m.layers.is_array()) return false;
  for (const auto& l : m.layers)
    if (l.is_object() && l.value("type", "") == "conv2d") return true;
  return false;
}

nlohmann::json run_job(const job_config& c, const job_options& o) {
  // A GPU's context, library handles and first library calls are made
  // while the data loads.
  std::thread devices_ready = prepare_devices(c.devices, has_convolutions(c.model));
  struct join_at_exit {
    std::thread& t;
    ~join_at_exit() {
      if (t.joinable()) t.join();
      release_prepared_devices();
    }
  } joined{devices_ready};
  kernels::init_cpu_kernels();
  // Which kernels run, measured here, so a slow machine's log says why.
  spdlog::info("kernels: {}", kernels::describe_cpu_kernels(true));
  auto plan = make_plan(c, o);
  if (devices_ready.joinable()) devices_ready.join();
  // Opened before any actor runs, so an unwritable path loses no training;
  // destroyed after the actor system, so a failing job's trace is written.
  std::optional<trace::session> tracing;
  start_trace(tracing, c, o);
  spdlog::info("job '{}': strategy {}, {} steps ({} per epoch), output {}", c.name, c.strategy.kind,
               plan->total_steps, plan->steps_per_epoch, plan->output_dir);
  if (c.strategy.replicas_auto)
    spdlog::info("strategy.replicas \"auto\": {} replicas on {} ({} usable cores)",
                 c.strategy.replicas, fmt::join(c.devices, ", "), usable_cpu_cores());

  system_config cfg;
  caf::actor_system sys{cfg};
  // /metrics and TensorBoard (logging.*); ends before the actor system.
  process_monitoring monitor(c, plan->output_dir, "local", sys);
  plan->metrics_sink = monitor.job_sinks(*plan);
  // The coordinator first: a strategy's own actors report to it.
  auto parts = std::make_shared<job_parts>();
  auto coord = sys.spawn(coordinator, std::shared_ptr<const job_plan>(plan), parts);
  // Every shard and every replica (or strategy worker) in this process.
  worker_spec spec;
  for (int64_t r = 0; r < plan->strat->replica_count(c); ++r) {
    spec.indices.push_back(r);
    spec.devices.push_back(c.devices[static_cast<std::size_t>(r) % c.devices.size()]);
  }
  spec.start_step = plan->start_step;
  auto shards = plan_shards(*plan);
  if (plan->strat->has_variable_shards()) {
    std::vector<int64_t> all(static_cast<std::size_t>(c.strategy.shards));
    for (std::size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int64_t>(s);
    spawn_shards(sys, *plan, all, shards);
  }
  spec.shards = shards.actors;
  spec.place = shards.place;
  job_actors here;
  if (plan->strat->own_job()) here.hub = plan->strat->spawn_hub(sys, plan, coord);
  here.workers = spawn_job_workers(sys, plan, std::move(spec),
                                   here.hub ? here.hub->handles() : caf::message{});
  here.shards = shards.actors;
  hand_over(*parts, here.workers, std::move(shards), here.hub);

  std::string error;
  nlohmann::json summary;
  try {
    summary = run_coordinator(sys, coord);
  } catch (const job_error& e) {
    error = e.what();
  }
  here.stop({caf::actor_cast<caf::actor>(coord)});
  coord = nullptr;
  parts.reset();
  here.join(sys);
  if (!error.empty()) throw job_error(error);
  finish_trace(tracing, summary);
  write_job_file((fs::path(plan->output_dir) / "summary.json").string(), summary.dump(2) + '\n');
  return summary;
}

}  // namespace troupe
