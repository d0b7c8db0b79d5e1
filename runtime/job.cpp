#include "runtime/job.hpp"

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "actors/system_config.hpp"
#include "kernels/cpu_kernels.hpp"
#include "runtime/coordinator.hpp"
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

nlohmann::json run_job(const job_config& c, const job_options& o) {
  kernels::init_cpu_kernels();
  // Which kernels run, measured here, so a slow machine's log says why.
  spdlog::info("kernels: {}", kernels::describe_cpu_kernels(true));
  auto plan = make_plan(c, o);
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
  std::shared_ptr<job_hub> hub;
  if (plan->strat->own_job()) hub = plan->strat->spawn_hub(sys, plan, coord);
  auto workers =
      spawn_job_workers(sys, plan, std::move(spec), hub ? hub->handles() : caf::message{});
  auto shard_actors = shards.actors;
  hand_over(*parts, workers, std::move(shards), hub);

  std::string error;
  nlohmann::json summary;
  try {
    summary = run_coordinator(sys, coord);
  } catch (const job_error& e) {
    error = e.what();
  }
  workers.stop();
  if (hub) hub->stop();
  for (auto& v : shard_actors) caf::anon_send_exit(v, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  auto devices = std::move(workers.devices);
  workers = {};
  shard_actors.clear();
  coord = nullptr;
  parts.reset();
  sys.await_all_actors_done();
  devices.clear();  // joins device threads after their last task
  hub.reset();      // the hub's devices, likewise
  if (!error.empty()) throw job_error(error);
  finish_trace(tracing, summary);
  std::ofstream(fs::path(plan->output_dir) / "summary.json") << summary.dump(2) << '\n';
  return summary;
}

}  // namespace troupe
