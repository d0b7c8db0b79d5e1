#include "strategies/lockstep_driver.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace troupe {
namespace {

// Executions in flight per replica: the next one's request waits in the
// replica's mailbox (its batches gathered) while the current one computes.
constexpr int64_t pipeline_depth = 2;

// "auto": the length an execution aims at, and its most steps.
constexpr double target_execution_seconds = 0.004;
constexpr int64_t max_auto_steps = 64;

}  // namespace

void lockstep_driver::start(coordinator_host& h) {
  const int64_t configured = h.plan().config.training.steps_per_execution;
  auto_ = configured == training_config::kAutoSteps;
  per_execution_ = auto_ ? 1 : configured;
}

void lockstep_driver::pump(coordinator_host& h) {
  // Nothing in flight (the start, after a boundary): the next interval
  // between executions done would count the wait for the first.
  if (h.issued() == h.completed()) last_done_ = {};
  while (h.issued() < h.boundary() &&
         h.issued() - h.completed() < pipeline_depth * per_execution_) {
    const int64_t count = std::min(per_execution_, h.boundary() - h.issued());
    issue(h, h.issued(), count);
    h.issued() += count;
  }
}

void lockstep_driver::measured(int64_t count) {
  const auto now = clock::now();
  const auto since = std::exchange(last_done_, now);
  if (since == clock::time_point{}) return;
  // With the pipeline full, the time between two executions done is the
  // later one's.
  const double per_step =
      std::chrono::duration<double>(now - since).count() / static_cast<double>(count);
  step_seconds_ = step_seconds_ == 0 ? per_step : 0.7 * step_seconds_ + 0.3 * per_step;
  // Clamped before the conversion; a step too short to measure gives the most.
  const double steps = step_seconds_ > 0 ? target_execution_seconds / step_seconds_ : 1e9;
  per_execution_ = std::lround(std::clamp(steps, 1.0, static_cast<double>(max_auto_steps)));
}

void lockstep_driver::summarize(nlohmann::json& summary) const {
  summary["steps_per_execution"] = per_execution_;
  summary["executions"] = executions_;
}

void lockstep_driver::issue(coordinator_host& h, int64_t first, int64_t count) {
  ++executions_;
  auto& replicas = h.replicas();
  fan_in<std::vector<step_stats>> parts(
      replicas.size(),
      [this, &h, count](std::vector<std::vector<step_stats>>& all) {
        if (auto_) measured(count);
        for (std::size_t j = 0; j < static_cast<std::size_t>(count); ++j) {
          step_stats sum;
          for (const auto& replica : all) {
            const auto& s = replica.at(j);
            sum.step = s.step;
            sum.epoch = s.epoch;
            sum.lr = s.lr;
            sum.loss_sum += s.loss_sum;
            sum.correct += s.correct;
            sum.count += s.count;
          }
          h.step_done(sum);
        }
      },
      h.failed("training step failed"));
  for (std::size_t i = 0; i < replicas.size(); ++i)
    h.self()
        ->request(replicas[i], h.request_timeout(), train_atom::value, first, count)
        .then(parts.reply(i), parts.error());
}

std::vector<replica_actor> lockstep_driver::live(const coordinator_host& h) const {
  return h.replicas();
}

}  // namespace troupe
