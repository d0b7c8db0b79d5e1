#include "strategies/variable_shards.hpp"

#include <map>

#include "kernels/lr_schedule.hpp"
#include "models/layer_model.hpp"

namespace troupe {

std::function<void(caf::error&)> shard_failed(replica_host& h) {
  return [&h](caf::error& e) {
    if (e != caf::sec::request_receiver_down) h.fail(e);
  };
}

void pull_all(replica_host& h, const std::vector<variable_shard_actor>& shards,
              std::function<void(std::vector<shard_values>&)> k) {
  h.communicating("pull");
  fan_in<shard_values> pulls(
      shards.size(),
      [&h, k = std::move(k)](std::vector<shard_values>& pulled) {
        h.communicated();
        k(pulled);
      },
      shard_failed(h));
  for (std::size_t s = 0; s < shards.size(); ++s)
    h.self()
        ->request(shards[s], h.request_timeout(), pull_atom::value, std::vector<std::string>{})
        .then(pulls.reply(s), pulls.error());
}

std::vector<tensor> pulled_variables(const compute_state& cs, const placement& place,
                                     const std::vector<shard_values>& pulled) {
  std::map<std::string, const tensor*> by_piece;
  for (const auto& sv : pulled)
    for (const auto& t : sv.values) by_piece[t.name] = &t.value;
  std::vector<tensor> out;
  for (const auto& v : cs.net->variables()) {
    std::vector<tensor> parts;
    for (const auto& piece : pieces_of(place, v.name)) {
      auto i = by_piece.find(piece.piece_name);
      if (i == by_piece.end())
        throw std::runtime_error("pulled values lack piece '" + piece.piece_name + "'");
      parts.push_back(*i->second);
    }
    tensor t = parts.size() == 1 ? parts.front() : join_rows(parts);
    if (t.shape() != v.value.shape())
      throw std::runtime_error("pulled variable '" + v.name + "' has shape " +
                               shape_string(t.shape()) + ", the model expects " +
                               shape_string(v.value.shape()));
    out.push_back(std::move(t));
  }
  return out;
}

void install_pulled(compute_state& cs, const placement& place,
                    const std::vector<shard_values>& pulled) {
  auto vals = pulled_variables(cs, place, pulled);
  auto& vars = cs.net->variables();
  for (std::size_t i = 0; i < vars.size(); ++i) vars[i].value = std::move(vals[i]);
}

std::vector<std::vector<named_tensor>> split_for_shard_pieces(
    const std::vector<named_tensor>& grads, const placement& place, std::size_t shards) {
  std::vector<std::vector<named_tensor>> out(shards);
  for (const auto& g : grads) {
    auto pieces = pieces_of(place, g.name);
    if (pieces.size() == 1) {
      out[static_cast<std::size_t>(pieces[0].shard)].push_back({pieces[0].piece_name, g.value});
      continue;
    }
    auto parts = split_rows(g.value, pieces);
    for (std::size_t k = 0; k < pieces.size(); ++k)
      out[static_cast<std::size_t>(pieces[k].shard)].push_back(
          {pieces[k].piece_name, std::move(parts[k])});
  }
  return out;
}

void eval_on_shards(replica_host& h, const replica_wiring& w,
                    std::function<void(std::function<void(compute_state&)>)> k) {
  pull_all(h, w.shards, [k, place = w.place](std::vector<shard_values>& pulled) {
    k([pulled = std::move(pulled), place](compute_state& cs) {
      install_pulled(cs, place, pulled);
    });
  });
}

namespace {

struct shard_push {
  step_stats stats;
  std::vector<std::vector<named_tensor>> grads;  // per shard
};

}  // namespace

void pull_compute_push_step::run(replica_host& h, int64_t step, batch b, step_promise rp) {
  h.set_busy(true);
  pull_all(h, wiring_.shards,
           [this, &h, step, b = std::move(b), rp](std::vector<shard_values>& pulled) mutable {
             std::vector<int64_t> versions;
             versions.reserve(pulled.size());
             for (const auto& v : pulled) versions.push_back(v.version);
             auto epoch = b.epoch;
             h.on_device<shard_push>(
                 "forward_backward",
                 [b = std::move(b), step, pulled = std::move(pulled), place = wiring_.place,
                  fail = h.fail_at_step(), local = local_mean_](compute_state& cs) {
                   install_pulled(cs, place, pulled);
                   cs.variables_to_device();
                   shard_push out;
                   out.stats = compute_gradients(cs, b, step, fail, local);
                   cs.gradients_to_host();
                   out.grads = split_for_shard_pieces(cs.grads, place, pulled.size());
                   return out;
                 },
                 [this, &h, rp, epoch, step, versions](shard_push& r) mutable {
                   r.stats.epoch = epoch;
                   h.count(r.stats);
                   const auto& shards = wiring_.shards;
                   fan_in<int64_t> pushes(
                       shards.size(),
                       [&h, rp, stats = r.stats](std::vector<int64_t>&) mutable {
                         h.communicated();
                         h.step_finished(rp, stats);
                       },
                       shard_failed(h));
                   h.communicating("push");
                   for (std::size_t s = 0; s < shards.size(); ++s)
                     h.self()
                         ->request(shards[s], h.request_timeout(), push_atom::value, wiring_.index,
                                   step, versions[s], std::move(r.grads[s]))
                         .then(pushes.reply(s), pushes.error());
                 });
           });
}

void snapshot_shards(coordinator_host& h, std::function<void(model_state&)> k) {
  const auto& shards = h.shards();
  fan_in<shard_state> states(
      shards.actors.size(),
      [&h, k](std::vector<shard_state>& all) {
        const auto& sh = h.shards();
        model_state ms;
        try {
          ms = join_shard_states(all, sh.place, sh.slot_suffixes);
        } catch (const std::exception& e) {
          h.fail(std::string("joining the shards' state failed: ") + e.what());
          return;
        }
        k(ms);
      },
      h.failed("checkpoint snapshot failed"));
  for (std::size_t i = 0; i < shards.actors.size(); ++i)
    h.self()
        ->request(shards.actors[i], h.request_timeout(), state_atom::value)
        .then(states.reply(i), states.error());
}

void restore_shards(coordinator_host& h, const model_state& ms, std::function<void()> k) {
  const auto& sh = h.shards();
  std::vector<shard_state> parts;
  try {
    parts = split_model_state(ms, sh.place, static_cast<int64_t>(sh.actors.size()),
                              sh.slot_suffixes, h.plan().start_step);
  } catch (const std::exception& e) {
    h.fail(h.resumed_checkpoint() + " does not fit the shards: " + e.what());
    return;
  }
  fan_in<int64_t> restored(
      parts.size(), [k](std::vector<int64_t>&) { k(); },
      h.failed("restoring " + h.resumed_checkpoint() + " failed"));
  for (std::size_t i = 0; i < parts.size(); ++i)
    h.self()
        ->request(sh.actors[i], h.request_timeout(), restore_atom::value, std::move(parts[i]))
        .then(restored.reply(i), restored.error());
}

void write_shard_stats(coordinator_host& h, int64_t epoch) {
  const auto& shards = h.shards().actors;
  for (std::size_t i = 0; i < shards.size(); ++i)
    h.self()
        ->request(shards[i], h.request_timeout(), stats_atom::value)
        .then(
            [&h, i, epoch](shard_stats& s) {
              h.write_metrics({{"type", "shard"},
                               {"shard", i},
                               {"epoch", epoch},
                               {"version", s.version},
                               {"pushes", s.pushes},
                               {"pulls", s.pulls},
                               {"applies", s.applies},
                               {"bytes_in", s.bytes_in},
                               {"bytes_out", s.bytes_out},
                               {"staleness_mean", s.staleness_mean},
                               {"staleness_max", s.staleness_max}});
              auto& sum = h.summary_extras();
              sum["staleness_max"] =
                  std::max<int64_t>(sum.value("staleness_max", int64_t{0}), s.staleness_max);
              sum["staleness_mean"] = s.staleness_mean;
            },
            h.failed("reading shard statistics failed"));
}

double scheduled_lr(const job_plan& p, int64_t completed) {
  return kernels::learning_rate_at(p.config.optimizer, completed - 1, p.total_steps);
}

double sharded_strategy::reported_lr(const job_plan& p, int64_t completed,
                                     const step_stats&) const {
  return scheduled_lr(p, completed);
}

// The shards hold the variables; the buffers (batch norm's running
// statistics) are the replicas', the first live one's saved.
void sharded_strategy::snapshot(coordinator_host& h, std::function<void(model_state&)> k) const {
  snapshot_shards(h, [&h, k](model_state& ms) {
    if (!has_model_buffers(h.plan().config.model)) return k(ms);
    auto all = std::make_shared<model_state>(std::move(ms));
    h.self()
        ->request(h.live_replicas().front(), h.request_timeout(), state_atom::value)
        .then(
            [all, k](model_state& replica) {
              all->buffers = std::move(replica.buffers);
              k(*all);
            },
            h.failed("checkpoint snapshot failed"));
  });
}

void sharded_strategy::restore(coordinator_host& h, std::shared_ptr<const model_state> ms,
                               std::function<void()> k) const {
  restore_shards(h, *ms, [&h, ms, k] {
    if (ms->buffers.empty()) return k();
    restore_every_replica(h, std::make_shared<const model_state>(model_state{{}, {}, ms->buffers}),
                          k);
  });
}

void sharded_strategy::on_epoch_end(coordinator_host& h, int64_t epoch) const {
  write_shard_stats(h, epoch);
}

}  // namespace troupe
