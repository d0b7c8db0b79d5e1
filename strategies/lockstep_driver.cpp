#include "strategies/lockstep_driver.hpp"

#include <algorithm>

namespace troupe {
namespace {

// Executions in flight per replica: the next one's request waits in the
// replica's mailbox (its batches gathered) while the current one computes.
constexpr int64_t pipeline_depth = 2;

}  // namespace

void lockstep_driver::pump(coordinator_host& h) {
  const int64_t per_execution = h.plan().config.training.steps_per_execution;
  while (h.issued() < h.boundary() && h.issued() - h.completed() < pipeline_depth * per_execution) {
    const int64_t count = std::min(per_execution, h.boundary() - h.issued());
    issue(h, h.issued(), count);
    h.issued() += count;
  }
}

void lockstep_driver::issue(coordinator_host& h, int64_t first, int64_t count) {
  auto& replicas = h.replicas();
  fan_in<std::vector<step_stats>> parts(
      replicas.size(),
      [&h, count](std::vector<std::vector<step_stats>>& all) {
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
