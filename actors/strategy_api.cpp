#include "actors/strategy_api.hpp"

#include <algorithm>

namespace troupe {
namespace {

device_execution_fn each_step(device_step_fn one) {
  return [one = std::move(one)](compute_state& cs, const std::vector<batch>& bs, int64_t first) {
    std::vector<step_stats> out;
    out.reserve(bs.size());
    for (std::size_t i = 0; i < bs.size(); ++i)
      out.push_back(one(cs, bs[i], first + static_cast<int64_t>(i)));
    return out;
  };
}

bool resident_fits(const compute_state& cs, const std::vector<batch>& bs, int64_t first,
                   int64_t fail_at_step) {
  if (!cs.resident) return false;
  if (fail_at_step >= first && fail_at_step < first + static_cast<int64_t>(bs.size())) return false;
  return std::all_of(bs.begin(), bs.end(),
                     [](const batch& b) { return b.ids.size() == 1 && b.ids.front().numel() > 0; });
}

std::vector<step_stats> run_resident(compute_state& cs, const std::vector<batch>& bs,
                                     int64_t first) {
  std::vector<resident_steps::step> steps;
  steps.reserve(bs.size());
  for (const auto& b : bs) steps.push_back({&b.ids.front(), b.global_size});
  const auto figures = cs.resident->run(steps);
  std::vector<step_stats> out(bs.size());
  for (std::size_t i = 0; i < bs.size(); ++i) {
    out[i].step = first + static_cast<int64_t>(i);
    out[i].loss_sum = figures[i].loss_sum;
    out[i].correct = figures[i].correct;
    out[i].count = figures[i].count;
    out[i].lr = cs.opt->lr_at(out[i].step);
  }
  return out;
}

}  // namespace

device_execution_fn resident_or_each(device_step_fn one, int64_t fail_at_step) {
  return [each = each_step(std::move(one)), fail_at_step](
             compute_state& cs, const std::vector<batch>& bs, int64_t first) {
    if (resident_fits(cs, bs, first, fail_at_step)) return run_resident(cs, bs, first);
    return each(cs, bs, first);
  };
}

void run_execution_on_device(replica_host& h, const char* span, int64_t first,
                             std::vector<batch> bs, device_execution_fn all, execution_promise rp) {
  std::vector<int64_t> epochs;
  epochs.reserve(bs.size());
  for (const auto& b : bs) epochs.push_back(b.epoch);
  h.on_device<std::vector<step_stats>>(
      span,
      [bs = std::move(bs), first, all = std::move(all)](compute_state& cs) {
        return all(cs, bs, first);
      },
      [&h, epochs = std::move(epochs), rp = std::move(rp)](std::vector<step_stats>& out) {
        for (std::size_t i = 0; i < out.size(); ++i) {
          out[i].epoch = epochs[i];
          h.count(out[i]);
        }
        rp(out);
      });
}

void run_on_device(replica_host& h, const char* span, int64_t first, std::vector<batch> bs,
                   device_step_fn one, execution_promise rp) {
  run_execution_on_device(h, span, first, std::move(bs), each_step(std::move(one)), std::move(rp));
}

void run_on_device(replica_host& h, const char* span, int64_t step, batch b, device_step_fn one,
                   step_promise rp) {
  std::vector<batch> bs;
  bs.push_back(std::move(b));
  run_on_device(h, span, step, std::move(bs), std::move(one),
                [rp = std::move(rp)](std::vector<step_stats>& all) { rp.deliver(all.front()); });
}

void collect_replica_states(coordinator_host& h, std::function<void(std::vector<model_state>&)> k) {
  auto& replicas = h.replicas();
  fan_in<model_state> states(replicas.size(), std::move(k),
                             h.failed("reading replica state failed"));
  for (std::size_t i = 0; i < replicas.size(); ++i)
    h.self()
        ->request(replicas[i], h.request_timeout(), state_atom::value)
        .then(states.reply(i), states.error());
}

}  // namespace troupe
