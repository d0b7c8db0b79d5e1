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
  if (plan->strat->own_job()) {
    auto summary = plan->strat->run_own_job(sys, plan);
    finish_trace(tracing, summary);
    std::ofstream(fs::path(plan->output_dir) / "summary.json") << summary.dump(2) << '\n';
    return summary;
  }
  // Every shard and every replica in this process.
  auto shards = plan_shards(*plan);
  if (plan->strat->has_variable_shards()) {
    std::vector<int64_t> all(static_cast<std::size_t>(c.strategy.shards));
    for (std::size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int64_t>(s);
    spawn_shards(sys, *plan, all, shards);
  }
  worker_spec spec;
  for (int64_t r = 0; r < c.strategy.replicas; ++r) {
    spec.indices.push_back(r);
    spec.devices.push_back(c.devices[static_cast<std::size_t>(r) % c.devices.size()]);
  }
  spec.shards = shards.actors;
  spec.place = shards.place;
  spec.start_step = plan->start_step;
  auto workers = spawn_workers(sys, *plan, std::move(spec));
  auto shard_actors = shards.actors;
  auto coord = sys.spawn(coordinator, std::shared_ptr<const job_plan>(plan), workers.replicas,
                         workers.named(), std::move(shards));

  std::string error;
  nlohmann::json summary;
  {
    caf::scoped_actor self{sys};
    self->request(coord, caf::infinite, run_atom::value)
        .receive([&](std::string& s) { summary = nlohmann::json::parse(s); },
                 [&](caf::error& e) { error = describe(e); });
    workers.stop();
    for (auto& v : shard_actors) self->send_exit(v, caf::exit_reason::user_shutdown);
    self->send_exit(coord, caf::exit_reason::user_shutdown);
  }
  auto devices = std::move(workers.devices);
  workers = {};
  shard_actors.clear();
  coord = nullptr;
  sys.await_all_actors_done();
  devices.clear();  // joins device threads after their last task
  if (!error.empty()) throw job_error(error);
  finish_trace(tracing, summary);
  std::ofstream(fs::path(plan->output_dir) / "summary.json") << summary.dump(2) << '\n';
  return summary;
}

}  // namespace troupe
