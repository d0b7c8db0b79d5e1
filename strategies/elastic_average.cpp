// elastic_average: elastic averaging SGD (EASGD, Zhang, Choromanska & LeCun
// 2015). Every worker trains its own copy x with its own optimizer; the
// variable shards hold the center c. Every strategy.communication_period
// local steps a worker exchanges with the center: d = moving_rate (x - c),
// x -= d here, c += d on the shards (the exchange message). With rho > 0
// every local gradient also gets rho (x - c) toward the last center seen.
// Asynchronous by default (each exchange applied on arrival); with
// strategy.synchronous all workers' exchanges of one round are summed and
// applied together. The model evaluated and saved is the center.
//
// One update (a local step of one worker):
//   coordinator --train(worker step)--> worker
//     [first step, or exchange step: --pull--> every shard]
//     (device: gradients + elastic force, update; on an exchange step d)
//     [--exchange(round, d of its pieces)--> every shard] --> reply
#include <algorithm>

#include "strategies/ssp_driver.hpp"
#include "strategies/strategy.hpp"
#include "strategies/variable_shards.hpp"

namespace troupe {
namespace {

// EASGD's moving rate: given, or beta / tau / p with beta = 0.9 (the paper's
// choice of beta = p * alpha, per communication period).
double moving_rate(const job_config& c) {
  if (c.strategy.moving_rate > 0) return c.strategy.moving_rate;
  return 0.9 / static_cast<double>(c.strategy.communication_period) /
         static_cast<double>(c.strategy.replicas);
}

// The worker's device-side state besides the model: the center last pulled,
// by variable (empty before the first pull; the shards never write buffers
// they handed out), and d of the last exchange.
struct elastic_device_state {
  std::vector<tensor> center;
  std::vector<named_tensor> delta;
};

// d = alpha (x - c), from the variables before this step's update (the
// paper's equations take both the gradient and the elastic term at x_t).
void elastic_delta(compute_state& cs, elastic_device_state& es, double alpha) {
  auto& vars = cs.net->variables();
  if (es.delta.empty()) es.delta = cs.net->make_gradients();
  const float a = static_cast<float>(alpha);
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const float* x = vars[i].value.f32();
    const float* c = es.center[i].f32();
    float* d = es.delta[i].value.f32();
    for (int64_t j = 0; j < vars[i].value.numel(); ++j) d[j] = a * (x[j] - c[j]);
  }
}

void subtract_delta(compute_state& cs, const elastic_device_state& es) {
  auto& vars = cs.net->variables();
  for (std::size_t i = 0; i < vars.size(); ++i) {
    float* x = vars[i].value.f32();
    const float* d = es.delta[i].value.f32();
    for (int64_t j = 0; j < vars[i].value.numel(); ++j) x[j] -= d[j];
  }
}

// The gradients plus the elastic force rho (x - c) toward the last center seen.
void add_elastic_force(compute_state& cs, const elastic_device_state& es, double rho) {
  if (rho == 0 || es.center.empty()) return;
  auto& vars = cs.net->variables();
  const float r = static_cast<float>(rho);
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const float* x = vars[i].value.f32();
    const float* c = es.center[i].f32();
    float* g = cs.grads[i].value.f32();
    for (int64_t j = 0; j < vars[i].value.numel(); ++j) g[j] += r * (x[j] - c[j]);
  }
}

struct elastic_result {
  step_stats stats;
  std::vector<std::vector<named_tensor>> deltas;  // per shard; empty: no exchange this step
};

class elastic_step final : public replica_step {
 public:
  elastic_step(replica_wiring w, int64_t period, double alpha, double rho)
      : wiring_(std::move(w)),
        period_(period),
        alpha_(alpha),
        rho_(rho),
        device_(std::make_shared<elastic_device_state>()) {}

  // A local step with the worker's own optimizer; every `period` steps (and
  // on the first step, to start from the center) the exchange with the
  // center. An exchange waits for the previous one's answers (synchronous:
  // until its round is applied).
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    h.set_busy(true);
    bool exchange = (step + 1) % period_ == 0;
    if (!exchange && joined_) {
      local_step(h, step, std::move(b), rp, {});
      return;
    }
    auto pull = [this, &h, step, b = std::move(b), rp]() mutable {
      pull_all(h, wiring_.shards,
               [this, &h, step, b = std::move(b), rp](std::vector<shard_values>& p) mutable {
                 local_step(h, step, std::move(b), rp, std::move(p));
               });
    };
    if (exchanges_pending_ > 0) {
      h.communicating("exchange");  // the previous round's answers
      after_exchange_ = std::move(pull);
    } else {
      pull();
    }
  }

  // Evaluation reads the center.
  void eval_variables(replica_host& h,
                      std::function<void(std::function<void(compute_state&)>)> k) override {
    eval_on_shards(h, wiring_, std::move(k));
  }

 private:
  void local_step(replica_host& h, int64_t step, batch b, step_promise rp,
                  std::vector<shard_values> pulled) {
    bool join = !joined_;  // a new (or restarted) worker starts from the center
    joined_ = true;
    bool exchange = (step + 1) % period_ == 0;
    std::vector<int64_t> versions;
    versions.reserve(pulled.size());
    for (const auto& v : pulled) versions.push_back(v.version);
    auto epoch = b.epoch;
    h.on_device<elastic_result>(
        "forward_backward_update",
        [b = std::move(b), step, join, exchange, pulled = std::move(pulled), place = wiring_.place,
         es = device_, fail = h.fail_at_step(), alpha = alpha_, rho = rho_](compute_state& cs) {
          // The elastic terms are computed on the host copies (on a
          // discrete device: staged across; the update stays on the device).
          if (join) {
            es->center = pulled_variables(cs, place, pulled);
            auto& vars = cs.net->variables();
            for (std::size_t i = 0; i < vars.size(); ++i) vars[i].value = es->center[i].clone();
            cs.variables_to_device();
          } else if (exchange || rho != 0) {
            cs.variables_to_host();
          }
          elastic_result out;
          out.stats = compute_gradients(cs, b, step, fail, true);
          cs.gradients_to_host();
          add_elastic_force(cs, *es, rho);
          if (exchange) {
            es->center = pulled_variables(cs, place, pulled);
            elastic_delta(cs, *es, alpha);
          }
          cs.gradients_to_device();
          cs.apply_update();
          if (!exchange) return out;
          cs.variables_to_host();
          subtract_delta(cs, *es);
          cs.variables_to_device();
          // The delta buffers are not touched again before the shards reply.
          out.deltas = split_for_shard_pieces(es->delta, place, pulled.size());
          return out;
        },
        [this, &h, rp, epoch, step, versions](elastic_result& r) mutable {
          r.stats.epoch = epoch;
          h.count(r.stats);
          send_exchange(h, step, versions, r.deltas);
          h.step_finished(rp, r.stats);
        });
  }

  // c += d on every shard (the exchange message). The step is done once d is sent: in the
  // synchronous variant the round is applied when every worker's d is in,
  // and this worker only waits for that at its next exchange (so a boundary
  // never strands it in a round the others cannot reach before the boundary).
  void send_exchange(replica_host& h, int64_t step, const std::vector<int64_t>& versions,
                     std::vector<std::vector<named_tensor>>& deltas) {
    int64_t round = (step + 1) / period_ - 1;
    for (std::size_t s = 0; s < deltas.size(); ++s) {
      ++exchanges_pending_;
      h.self()
          ->request(wiring_.shards[s], h.request_timeout(), exchange_atom::value, wiring_.index,
                    round, versions[s], std::move(deltas[s]))
          .then(
              [this](int64_t) {
                if (--exchanges_pending_ > 0 || !after_exchange_) return;
                auto next = std::move(after_exchange_);
                after_exchange_ = nullptr;
                next();
              },
              shard_failed(h));
    }
  }

  replica_wiring wiring_;
  int64_t period_;
  double alpha_, rho_;
  std::shared_ptr<elastic_device_state> device_;  // touched only on the device
  bool joined_ = false;                           // started from the center
  // Exchanges of the last round not answered yet; the next exchange waits.
  int64_t exchanges_pending_ = 0;
  std::function<void()> after_exchange_;
};

class elastic_average final : public sharded_worker_strategy {
 public:
  std::string name() const override { return "elastic_average"; }

  // strategy.replicas: the workers; the variable shards hold the center.
  std::vector<strategy_key> keys() const override {
    auto keys = strategy_keys::variable_shards();
    keys.push_back(strategy_keys::replicas());
    keys.push_back(strategy_keys::max_staleness());
    keys.push_back(field_key("communication_period", &strategy_config::communication_period,
                             integer_at_least(1)));
    keys.push_back(
        field_key("moving_rate", &strategy_config::moving_rate, number_in(json_read::unit_closed)));
    keys.push_back(field_key("rho", &strategy_config::rho, number_in(json_read::non_negative)));
    keys.push_back(field_key("synchronous", &strategy_config::synchronous, boolean()));
    return keys;
  }

  // The center: it takes exchanges (c += d) and runs no optimizer of its
  // own. Its optimizer setting is plain SGD, which has no slots: a
  // checkpoint's slots are the workers' (see snapshot).
  variable_shard_config shard_config(const job_config& c, int64_t total_steps) const override {
    auto sc = sharded_worker_strategy::shard_config(c, total_steps);
    sc.optimizer = optimizer_config{};
    sc.optimizer.kind = "sgd";
    sc.aggregate = c.strategy.synchronous ? c.strategy.replicas : 0;
    sc.center = true;
    return sc;
  }

  std::unique_ptr<replica_step> make_replica_step(const job_config& c,
                                                  const replica_wiring& w) const override {
    return std::make_unique<elastic_step>(w, c.strategy.communication_period, moving_rate(c),
                                          c.strategy.rho);
  }

  std::unique_ptr<job_driver> make_driver(const job_plan& p) const override {
    const auto& s = p.config.strategy;
    ssp_driver::settings ds;
    ds.max_staleness = s.max_staleness;
    if (s.synchronous) {
      // A worker waits at an exchange for the others' previous round, so none
      // may run a whole period ahead; the shards wait for one exchange per
      // admitted, live worker per round.
      int64_t cap = s.communication_period - 1;
      ds.max_staleness = ds.max_staleness < 0 ? cap : std::min(ds.max_staleness, cap);
      ds.contributors_changed = [](coordinator_host& h, int64_t k) {
        for (const auto& shard : h.shards().actors)
          h.self()
              ->request(shard, h.request_timeout(), aggregate_atom::value, k)
              .then([](int64_t) {}, h.failed("telling the shards the workers failed"));
      };
    }
    return std::make_unique<ssp_driver>(p, std::move(ds));
  }

  // The center is the model; the optimizer slots (local to each worker) are
  // the first live worker's, so the checkpoint resumes under any strategy;
  // with checkpoint.save_local_copies every live worker's variables go beside
  // them as "local/<worker>/<variable>" (entries no optimizer reads).
  void snapshot(coordinator_host& h, std::function<void(model_state&)> k) const override {
    snapshot_shards(h, [&h, k](model_state& center) {
      const bool all_locals = h.plan().config.checkpoint.save_local_copies;
      const auto live = h.live_replicas();
      const auto& replicas = h.replicas();
      std::vector<std::size_t> asked;
      for (std::size_t i = 0; i < replicas.size(); ++i)
        if (std::find(live.begin(), live.end(), replicas[i]) != live.end() &&
            (asked.empty() || all_locals))
          asked.push_back(i);
      auto all = std::make_shared<model_state>(std::move(center));
      fan_in<model_state> locals(
          asked.size(),
          [all, asked, all_locals, k](std::vector<model_state>& got) {
            all->slots = std::move(got[0].slots);
            all->buffers = std::move(got[0].buffers);
            for (std::size_t j = 0; j < asked.size() && all_locals; ++j)
              for (auto& v : got[j].variables)
                all->slots.push_back(
                    {"local/" + std::to_string(asked[j]) + "/" + v.name, std::move(v.value)});
            k(*all);
          },
          h.failed("checkpoint snapshot failed"));
      for (std::size_t j = 0; j < asked.size(); ++j)
        h.self()
            ->request(replicas[asked[j]], h.request_timeout(), state_atom::value)
            .then(locals.reply(j), locals.error());
    });
  }

  bool snapshot_slots_count_own_steps() const override { return true; }

  // The center to the shards, the workers' slots to the workers (which pull
  // the center at their first step).
  void restore(coordinator_host& h, std::shared_ptr<const model_state> ms,
               std::function<void()> k) const override {
    restore_shards(h, *ms, [&h, ms, k] { restore_every_replica(h, ms, k); });
  }
};

const strategy_registration registered{std::make_shared<elastic_average>()};

}  // namespace
}  // namespace troupe
