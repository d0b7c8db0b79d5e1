#include "actors/strategy_api.hpp"

namespace troupe {

void run_on_device(replica_host& h, const char* span, int64_t first, std::vector<batch> bs,
                   device_step_fn one, execution_promise rp) {
  std::vector<int64_t> epochs;
  epochs.reserve(bs.size());
  for (const auto& b : bs) epochs.push_back(b.epoch);
  h.on_device<std::vector<step_stats>>(
      span,
      [bs = std::move(bs), first, one = std::move(one)](compute_state& cs) {
        std::vector<step_stats> out;
        out.reserve(bs.size());
        for (std::size_t i = 0; i < bs.size(); ++i)
          out.push_back(one(cs, bs[i], first + static_cast<int64_t>(i)));
        return out;
      },
      [&h, epochs = std::move(epochs), rp = std::move(rp)](std::vector<step_stats>& all) {
        for (std::size_t i = 0; i < all.size(); ++i) {
          all[i].epoch = epochs[i];
          h.count(all[i]);
        }
        rp(all);
      });
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
