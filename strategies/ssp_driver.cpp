#include "strategies/ssp_driver.hpp"

#include <spdlog/spdlog.h>

#include "actors/input_pipeline.hpp"

namespace troupe {

ssp_driver::ssp_driver(const job_plan& plan, settings s)
    : settings_(std::move(s)), workers_(static_cast<std::size_t>(plan.config.strategy.replicas)) {
  const auto& late = faults_or_none(plan.options.faults).join_late;
  if (late.index >= 0 && late.index < static_cast<int64_t>(workers_.size()))
    workers_[static_cast<std::size_t>(late.index)].admit_at = std::max<int64_t>(1, late.at);
}

// The slowest admitted, live worker's clock (-1: none).
int64_t ssp_driver::slowest_clock() const {
  int64_t m = -1;
  for (const auto& w : workers_)
    if (w.alive && w.admitted && (m < 0 || w.clock < m)) m = w.clock;
  return m;
}

void ssp_driver::contributors(coordinator_host& h) {
  if (!settings_.contributors_changed) return;
  int64_t k = 0;
  for (const auto& w : workers_) k += w.alive && w.admitted ? 1 : 0;
  settings_.contributors_changed(h, k);
}

void ssp_driver::start(coordinator_host& h) {
  admit(h);
  contributors(h);  // workers that join later are not counted yet
}

// Admits workers whose time has come: a joining worker starts level with the
// slowest one, so the staleness bound does not stall the others.
void ssp_driver::admit(coordinator_host& h) {
  bool joined = false;
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    auto& w = workers_[i];
    if (!w.alive || w.admitted || h.completed() < w.admit_at) continue;
    w.admitted = true;
    w.clock = std::max<int64_t>(0, slowest_clock());
    if (w.admit_at > 0) {
      joined = true;
      spdlog::info("worker {} joins at update {} (worker step {})", i, h.completed(), w.clock);
      h.write_metrics({{"type", "worker_joined"}, {"worker", i}, {"step", h.completed()}});
    }
  }
  if (joined) contributors(h);
}

void ssp_driver::issue(coordinator_host& h, std::size_t i) {
  auto& w = workers_[i];
  w.busy = true;
  ++h.issued();
  h.self()
      ->request(h.replicas()[i], h.request_timeout(), train_atom::value, w.clock)
      .then(
          [this, &h, i](step_stats& s) {
            auto& w = workers_[i];
            w.busy = false;
            ++w.clock;
            h.write_metrics({{"type", "push"}, {"worker", i}, {"worker_step", s.step}});
            h.step_done(s);
          },
          h.failed("training step failed"));
}

void ssp_driver::pump(coordinator_host& h) {
  admit(h);
  const int64_t k = settings_.max_staleness;
  for (std::size_t i = 0; i < workers_.size() && h.issued() < h.boundary(); ++i) {
    auto& w = workers_[i];
    if (!w.alive || !w.admitted || w.busy) continue;
    // Stale synchronous parallel: at most k steps ahead of the slowest.
    if (k >= 0 && w.clock - slowest_clock() > k) continue;
    issue(h, i);
  }
}

// A lost worker is dropped; its step in flight is given up (never counted).
bool ssp_driver::replica_lost(coordinator_host& h, std::size_t i, const std::string& cause) {
  auto& w = workers_[i];
  if (!w.alive) return true;
  w.alive = false;
  if (w.busy) --h.issued();
  w.busy = false;
  std::size_t left = 0;
  for (const auto& x : workers_) left += x.alive ? 1 : 0;
  const auto& tasks = h.plan().replica_tasks;
  std::string task = i < tasks.size() ? tasks[i] : "";
  spdlog::warn("worker {}{} lost ({}); {} workers go on", i, task.empty() ? "" : " on task " + task,
               cause, left);
  contributors(h);
  nlohmann::json line{{"type", "worker_lost"},
                      {"worker", i},
                      {"step", h.completed()},
                      {"cause", cause},
                      {"workers_left", left}};
  if (!task.empty()) line["task"] = task;
  h.write_metrics(line);
  if (left == 0) {
    h.fail("every worker is lost (the last: worker " + std::to_string(i) + ", " + cause + ")");
    return true;
  }
  h.steps_given_up();
  return true;
}

void ssp_driver::rejoin(coordinator_host& h, std::size_t i, caf::actor a) {
  if (i >= workers_.size() || workers_[i].alive) return;
  auto& replicas = h.replicas();
  replicas[i] = caf::actor_cast<replica_actor>(std::move(a));
  h.self()->monitor(replicas[i]);
  auto& w = workers_[i];
  w = worker_status{};
  w.admit_at = std::max<int64_t>(1, h.completed());  // admitted at once, as a late joiner
  const auto& tasks = h.plan().replica_tasks;
  spdlog::info("worker {} is back{}", i, i < tasks.size() ? " on task " + tasks[i] : std::string());
  if (h.issued() < h.boundary()) pump(h);
}

std::vector<replica_actor> ssp_driver::live(const coordinator_host& h) const {
  std::vector<replica_actor> out;
  const auto& replicas = h.replicas();
  for (std::size_t i = 0; i < replicas.size(); ++i)
    if (workers_[i].alive) out.push_back(replicas[i]);
  return out;
}

int64_t sharded_worker_strategy::updates_per_epoch(const job_config& c, int64_t examples) const {
  return c.strategy.replicas *
         batches_per_epoch(examples, c.data.batch_size * c.strategy.replicas, 1);
}

input_plan sharded_worker_strategy::input(const job_config& c, int64_t start_step,
                                          int64_t steps_per_epoch) const {
  input_plan in;
  in.global_batch = c.data.batch_size * c.strategy.replicas;
  in.start_epoch = start_step / steps_per_epoch;
  // Each worker's own position, about.
  in.start_index = start_step % steps_per_epoch / c.strategy.replicas;
  return in;
}

void sharded_worker_strategy::validate(const job_config& c) const {
  if (c.strategy.steps_per_update != 1)
    throw config_error("strategy.steps_per_update",
                       "parameter_server and elastic_average workers step on every batch; "
                       "gradient accumulation needs 1, got " +
                           std::to_string(c.strategy.steps_per_update));
}

}  // namespace troupe
