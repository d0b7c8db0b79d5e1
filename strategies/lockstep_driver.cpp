#include "strategies/lockstep_driver.hpp"

namespace troupe {
namespace {

// Steps in flight per replica: the next step's request waits in the
// replica's mailbox while the current one computes.
constexpr int64_t pipeline_depth = 2;

}  // namespace

void lockstep_driver::pump(coordinator_host& h) {
  while (h.issued() < h.boundary() && h.issued() - h.completed() < pipeline_depth)
    issue(h, h.issued()++);
}

void lockstep_driver::issue(coordinator_host& h, int64_t step) {
  auto& replicas = h.replicas();
  fan_in<step_stats> parts(
      replicas.size(),
      [&h](std::vector<step_stats>& all) {
        step_stats sum;
        for (const auto& s : all) {
          sum.step = s.step;
          sum.epoch = s.epoch;
          sum.lr = s.lr;
          sum.loss_sum += s.loss_sum;
          sum.correct += s.correct;
          sum.count += s.count;
        }
        h.step_done(sum);
      },
      h.failed("training step failed"));
  for (std::size_t i = 0; i < replicas.size(); ++i)
    h.self()
        ->request(replicas[i], h.request_timeout(), train_atom::value, step)
        .then(parts.reply(i), parts.error());
}

std::vector<replica_actor> lockstep_driver::live(const coordinator_host& h) const {
  return h.replicas();
}

}  // namespace troupe
