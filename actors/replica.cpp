#include "actors/replica.hpp"

#include <spdlog/spdlog.h>
#include <deque>
#include <map>

#include "kernels/optimizer.hpp"

namespace troupe {

// Model and optimizer are touched only by device tasks (one thread, FIFO);
// everything else only by the actor.
struct compute_state {
  std::unique_ptr<model> net;
  std::unique_ptr<kernels::optimizer> opt;
  std::vector<named_tensor> grads;
  // shard_optimizer: this replica's reduce-scatter segments of the variables.
  std::vector<std::pair<int64_t, int64_t>> segments;
  // elastic_average: the center last pulled, by variable (empty before the
  // first pull); the shards never write buffers they handed out.
  std::vector<tensor> center;
  std::vector<named_tensor> delta;  // alpha (x - c) of the last exchange
};

namespace {

using self_ptr = replica_actor::stateful_pointer<replica_state>;

// Runs `work` on the device thread; `then` runs on the actor with its result,
// or the actor quits with the error (the coordinator sees it as a down_msg).
template <class R>
void on_device(self_ptr self, std::function<R(compute_state&)> work, std::function<void(R&)> then) {
  auto ticket = self->state.next_ticket++;
  struct outcome {
    R value{};
    std::string error;
  };
  auto out = std::make_shared<outcome>();
  self->state.pending.emplace(ticket, [self, out, then = std::move(then)] {
    if (!out->error.empty()) {
      spdlog::error("replica {}: {}", self->state.cfg.index, out->error);
      self->quit(
          caf::make_error(caf::sec::runtime_error,
                          "replica " + std::to_string(self->state.cfg.index) + ": " + out->error));
      return;
    }
    then(out->value);
  });
  auto handle = caf::actor_cast<replica_actor>(self);
  self->state.cfg.device->submit(
      [cs = self->state.compute, out, work = std::move(work), handle, ticket] {
        try {
          out->value = work(*cs);
        } catch (const std::exception& e) {
          out->error = e.what();
        }
        caf::anon_send(handle, computed_atom::value, ticket);
      });
}

void try_start(self_ptr self);

void request_batches(self_ptr self) {
  auto& st = self->state;
  // Keep one batch ahead per waiting step plus one spare.
  int64_t want = static_cast<int64_t>(st.waiting_steps.size()) + 1;
  while (st.batches_requested + static_cast<int64_t>(st.batches.size()) < want) {
    ++st.batches_requested;
    self->request(st.cfg.input, st.cfg.request_timeout, next_atom::value)
        .then(
            [self](batch& b) {
              --self->state.batches_requested;
              self->state.batches.push_back(std::move(b));
              try_start(self);
            },
            [self](caf::error& e) { self->quit(e); });
  }
}

// The update itself, on the device; then the step is done.
void apply_update(self_ptr self, step_stats s, caf::typed_response_promise<step_stats> rp) {
  on_device<int>(
      self,
      [](compute_state& cs) {
        cs.opt->apply(cs.net->variables(), cs.grads);
        return 0;
      },
      [s, rp](int&) mutable { rp.deliver(s); });
  // The device runs tasks in order, so the next step's gradients may be
  // queued right behind this update: the reducer is done with the buffers.
  self->state.busy = false;
  try_start(self);
}

std::vector<tensor> variable_buffers(compute_state& cs) {
  std::vector<tensor> out;
  for (auto& v : cs.net->variables()) out.push_back(v.value);
  return out;
}

// ZeRO stage 1: reduce-scatter the gradients, update only this replica's
// segments (1/N of the optimizer's work), all-gather the variables. The next
// step's gradients wait for the all-gather: they read the variables.
void sharded_update(self_ptr self, step_stats s, caf::typed_response_promise<step_stats> rp) {
  auto& st = self->state;
  self->request(st.cfg.reducer, self->state.cfg.request_timeout, reduce_scatter_atom::value,
                reduce_op::sum, st.grad_buffers)
      .then(
          [self, s, rp](std::vector<tensor>&) mutable {
            on_device<std::vector<tensor>>(
                self,
                [](compute_state& cs) {
                  cs.opt->apply_ranges(cs.net->variables(), cs.grads, cs.segments);
                  return variable_buffers(cs);
                },
                [self, s, rp](std::vector<tensor>& vars) mutable {
                  self->request(self->state.cfg.reducer, self->state.cfg.request_timeout,
                                all_gather_atom::value, std::move(vars))
                      .then(
                          [self, s, rp](std::vector<tensor>&) mutable {
                            self->state.busy = false;
                            rp.deliver(s);
                            try_start(self);
                          },
                          [self](caf::error& e) { self->quit(e); });
                });
          },
          [self](caf::error& e) { self->quit(e); });
}

// Gradients of a step's micro-batches into cs.grads (accumulated), scaled so
// that they are the mean over the global batch, or over this replica's batch
// with local_mean.
step_stats compute_gradients(compute_state& cs, const batch& b, int64_t step, int64_t fail,
                             bool local_mean) {
  if (step == fail) throw std::runtime_error("injected failure at step " + std::to_string(step));
  int64_t n = b.global_size;
  if (local_mean) {
    n = 0;
    for (const auto& x : b.x) n += x.empty() ? 0 : x.dim(0);
  }
  float scale = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
  step_stats s;
  s.step = step;
  s.lr = cs.opt->current_lr();
  for (std::size_t m = 0; m < b.x.size(); ++m) {
    auto r = cs.net->train_batch(b.x[m], b.y[m], scale, cs.grads, m > 0);
    s.loss_sum += r.loss_sum;
    s.correct += r.correct;
    s.count += r.count;
  }
  return s;
}

// Sync-on-read training metrics: summed here, read (and reset) by the coordinator.
void count_step(replica_state& st, const step_stats& s) {
  st.train_metrics.loss_sum += s.loss_sum;
  st.train_metrics.correct += s.correct;
  st.train_metrics.count += s.count;
}

// --- variables on shards (central_storage, parameter_server) ---

// The pulled pieces become the model's variables: an unsplit variable takes
// the shard's tensor itself (a shard never writes a buffer it handed out),
// a split one is joined.
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

// The gradients each shard gets: its pieces, named by piece; an unsplit
// variable's gradient buffer itself (the shard is done with it when it
// replies, before this replica computes again).
std::vector<std::vector<named_tensor>> gradients_for_shards(const std::vector<named_tensor>& grads,
                                                            const placement& place,
                                                            std::size_t shards) {
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

// A failed request to a shard. A shard that died is the coordinator's to
// report (it monitors the shards): quitting here with "receiver down" could
// reach it first and name this replica instead.
auto shard_failed(self_ptr self) {
  return [self](caf::error& e) {
    if (e != caf::sec::request_receiver_down) self->quit(e);
  };
}

// Pulls every shard's pieces (all at once), then calls k with them in shard order.
void pull_all(self_ptr self, std::function<void(std::vector<shard_values>&)> k) {
  auto& shards = self->state.cfg.shards;
  auto got = std::make_shared<std::vector<shard_values>>(shards.size());
  auto left = std::make_shared<std::size_t>(shards.size());
  for (std::size_t s = 0; s < shards.size(); ++s)
    self->request(shards[s], self->state.cfg.request_timeout, pull_atom::value,
                  std::vector<std::string>{})
        .then(
            [got, left, s, k](shard_values& v) {
              (*got)[s] = std::move(v);
              if (--*left == 0) k(*got);
            },
            shard_failed(self));
}

struct shard_push {
  step_stats stats;
  std::vector<std::vector<named_tensor>> grads;  // per shard
};

// One step against the shards: pull, gradients, push; done when every shard
// has applied its part (parameter_server: on arrival; central_storage: once
// all replicas' pushes for the step are in).
void shard_step(self_ptr self, int64_t step, batch b, caf::typed_response_promise<step_stats> rp) {
  auto& st = self->state;
  st.busy = true;
  pull_all(self, [self, step, b = std::move(b), rp](std::vector<shard_values>& pulled) mutable {
    auto& st = self->state;
    std::vector<int64_t> versions;
    for (const auto& v : pulled) versions.push_back(v.version);
    auto epoch = b.epoch;
    on_device<shard_push>(
        self,
        [b = std::move(b), step, pulled = std::move(pulled), place = st.cfg.place,
         fail = st.cfg.fail_at_step, local = st.cfg.local_mean](compute_state& cs) {
          install_pulled(cs, place, pulled);
          shard_push out;
          out.stats = compute_gradients(cs, b, step, fail, local);
          out.grads = gradients_for_shards(cs.grads, place, pulled.size());
          return out;
        },
        [self, rp, epoch, step, versions](shard_push& r) mutable {
          auto& st = self->state;
          r.stats.epoch = epoch;
          count_step(st, r.stats);
          auto left = std::make_shared<std::size_t>(st.cfg.shards.size());
          auto stats = r.stats;
          for (std::size_t s = 0; s < st.cfg.shards.size(); ++s)
            self->request(st.cfg.shards[s], self->state.cfg.request_timeout, push_atom::value,
                          st.cfg.index, step, versions[s], std::move(r.grads[s]))
                .then(
                    [self, left, rp, stats](int64_t) mutable {
                      if (--*left > 0) return;
                      self->state.busy = false;
                      rp.deliver(stats);
                      try_start(self);
                    },
                    shard_failed(self));
        });
  });
}

// --- elastic averaging (EASGD) ---

struct elastic_result {
  step_stats stats;
  std::vector<std::vector<named_tensor>> deltas;  // per shard; empty: no exchange this step
};

// d = alpha (x - c), from the variables before this step's update (the
// paper's equations take both the gradient and the elastic term at x_t).
void elastic_delta(compute_state& cs, double alpha) {
  auto& vars = cs.net->variables();
  if (cs.delta.empty()) cs.delta = cs.net->make_gradients();
  const float a = static_cast<float>(alpha);
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const float* x = vars[i].value.f32();
    const float* c = cs.center[i].f32();
    float* d = cs.delta[i].value.f32();
    for (int64_t j = 0; j < vars[i].value.numel(); ++j) d[j] = a * (x[j] - c[j]);
  }
}

void subtract_delta(compute_state& cs) {
  auto& vars = cs.net->variables();
  for (std::size_t i = 0; i < vars.size(); ++i) {
    float* x = vars[i].value.f32();
    const float* d = cs.delta[i].value.f32();
    for (int64_t j = 0; j < vars[i].value.numel(); ++j) x[j] -= d[j];
  }
}

// The gradients plus the elastic force rho (x - c) toward the last center seen.
void add_elastic_force(compute_state& cs, double rho) {
  if (rho == 0 || cs.center.empty()) return;
  auto& vars = cs.net->variables();
  const float r = static_cast<float>(rho);
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const float* x = vars[i].value.f32();
    const float* c = cs.center[i].f32();
    float* g = cs.grads[i].value.f32();
    for (int64_t j = 0; j < vars[i].value.numel(); ++j) g[j] += r * (x[j] - c[j]);
  }
}

void elastic_step(self_ptr self, int64_t step, batch b, caf::typed_response_promise<step_stats> rp,
                  std::vector<shard_values> pulled);

// A local step with the replica's own optimizer; every `period` steps (and on
// the first step, to start from the center) the exchange with the center.
void start_elastic_step(self_ptr self, int64_t step, batch b,
                        caf::typed_response_promise<step_stats> rp) {
  auto& st = self->state;
  st.busy = true;
  bool exchange = (step + 1) % st.cfg.period == 0;
  if (!exchange && st.elastic_joined) {
    elastic_step(self, step, std::move(b), rp, {});
    return;
  }
  auto pull = [self, step, b = std::move(b), rp]() mutable {
    pull_all(self, [self, step, b = std::move(b), rp](std::vector<shard_values>& p) mutable {
      elastic_step(self, step, std::move(b), rp, std::move(p));
    });
  };
  if (st.exchange_pending > 0)
    st.after_exchange = std::move(pull);
  else
    pull();
}

void elastic_step(self_ptr self, int64_t step, batch b, caf::typed_response_promise<step_stats> rp,
                  std::vector<shard_values> pulled) {
  auto& st = self->state;
  bool join = !st.elastic_joined;  // a new (or restarted) worker starts from the center
  st.elastic_joined = true;
  bool exchange = (step + 1) % st.cfg.period == 0;
  std::vector<int64_t> versions;
  for (const auto& v : pulled) versions.push_back(v.version);
  auto epoch = b.epoch;
  on_device<elastic_result>(
      self,
      [b = std::move(b), step, join, exchange, pulled = std::move(pulled),
       cfg = st.cfg](compute_state& cs) {
        if (join) {
          cs.center = pulled_variables(cs, cfg.place, pulled);
          auto& vars = cs.net->variables();
          for (std::size_t i = 0; i < vars.size(); ++i) vars[i].value = cs.center[i].clone();
        }
        elastic_result out;
        out.stats = compute_gradients(cs, b, step, cfg.fail_at_step, true);
        add_elastic_force(cs, cfg.rho);
        if (exchange) {
          cs.center = pulled_variables(cs, cfg.place, pulled);
          elastic_delta(cs, cfg.alpha);
        }
        cs.opt->apply(cs.net->variables(), cs.grads);
        if (!exchange) return out;
        subtract_delta(cs);
        // The delta buffers are not touched again before the shards reply.
        out.deltas = gradients_for_shards(cs.delta, cfg.place, pulled.size());
        return out;
      },
      [self, rp, epoch, step, versions](elastic_result& r) mutable {
        auto& st = self->state;
        r.stats.epoch = epoch;
        count_step(st, r.stats);
        // c += d: the center shards "apply" d with SGD at learning rate -1.
        // The step is done once d is sent: in the synchronous variant the
        // round is applied when every worker's d is in, and this worker only
        // waits for that at its next exchange (so a boundary never strands
        // it in a round the others cannot reach before the boundary).
        int64_t round = (step + 1) / st.cfg.period - 1;
        for (std::size_t s = 0; s < r.deltas.size(); ++s) {
          ++st.exchange_pending;
          self->request(st.cfg.shards[s], self->state.cfg.request_timeout, push_atom::value,
                        st.cfg.index, round, versions[s], std::move(r.deltas[s]))
              .then(
                  [self](int64_t) {
                    auto& st = self->state;
                    if (--st.exchange_pending > 0 || !st.after_exchange) return;
                    auto next = std::move(st.after_exchange);
                    st.after_exchange = nullptr;
                    next();
                  },
                  shard_failed(self));
        }
        st.busy = false;
        rp.deliver(r.stats);
        try_start(self);
      });
}

// One step: gradients over the step's micro-batches (accumulated), then, with
// a reducer, the all-reduce (sum: every replica already scaled its gradients
// by 1/global_size, so the sum is the mean over the global batch), then the
// update. Without a reducer, gradients and update are one device task, and
// the next step may be queued on the device behind it.
void start_step(self_ptr self, int64_t step, batch b, caf::typed_response_promise<step_stats> rp) {
  auto& st = self->state;
  if (st.cfg.elastic) {
    start_elastic_step(self, step, std::move(b), rp);
    request_batches(self);
    return;
  }
  if (!st.cfg.shards.empty()) {
    shard_step(self, step, std::move(b), rp);
    request_batches(self);
    return;
  }
  const bool reduce = static_cast<bool>(st.cfg.reducer);
  st.busy = reduce;
  auto epoch = b.epoch;
  on_device<step_stats>(
      self,
      [b = std::move(b), step, reduce, fail = st.cfg.fail_at_step](compute_state& cs) {
        auto s = compute_gradients(cs, b, step, fail, false);
        if (!reduce) cs.opt->apply(cs.net->variables(), cs.grads);
        return s;
      },
      [self, rp, epoch, reduce](step_stats& s) mutable {
        s.epoch = epoch;
        auto& st = self->state;
        count_step(st, s);
        if (!reduce) {
          rp.deliver(s);
          return;
        }
        if (st.cfg.shard_optimizer) {
          sharded_update(self, s, rp);
          return;
        }
        self->request(st.cfg.reducer, self->state.cfg.request_timeout, allreduce_atom::value,
                      reduce_op::sum, st.grad_buffers)
            .then([self, s, rp](std::vector<tensor>&) mutable { apply_update(self, s, rp); },
                  [self](caf::error& e) { self->quit(e); });
      });
  request_batches(self);
}

// Sharded slots are current only in their owner's segments: all-gather them,
// one slot kind at a time (each is laid out like the variables), before a
// snapshot. Every replica is asked for its state at the same points of the
// job, so the collectives match.
void gather_slots(self_ptr self, std::size_t k, std::function<void()> done) {
  on_device<std::vector<tensor>>(
      self,
      [k](compute_state& cs) {
        return k < cs.opt->slot_names().size() ? cs.opt->slot_tensors(k) : std::vector<tensor>{};
      },
      [self, k, done](std::vector<tensor>& slots) {
        if (slots.empty()) {
          done();
          return;
        }
        self->request(self->state.cfg.reducer, self->state.cfg.request_timeout,
                      all_gather_atom::value, std::move(slots))
            .then([self, k, done](std::vector<tensor>&) { gather_slots(self, k + 1, done); },
                  [self](caf::error& e) { self->quit(e); });
      });
}

void try_start(self_ptr self) {
  auto& s = self->state;
  while (!s.busy && !s.batches.empty() && !s.waiting_steps.empty()) {
    auto [step, rp] = std::move(s.waiting_steps.front());
    s.waiting_steps.pop_front();
    batch next = std::move(s.batches.front());
    s.batches.pop_front();
    start_step(self, step, std::move(next), std::move(rp));
  }
}

}  // namespace

replica_actor::behavior_type replica(self_ptr self, replica_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.compute = std::make_shared<compute_state>();
  // Build the model on its device thread: its memory is first touched there.
  on_device<std::vector<tensor>>(
      self,
      [c = st.cfg](compute_state& cs) {
        cs.net = create_model(c.model, c.shape, c.seed);
        cs.opt = std::make_unique<kernels::optimizer>(c.optimizer, c.total_steps);
        cs.opt->init(cs.net->variables());
        cs.grads = cs.net->make_gradients();
        if (c.shard_optimizer) {
          int64_t numel = 0;
          for (auto& g : cs.grads) numel += g.value.numel();
          cs.segments = reduce_scatter_segments(numel, c.reducer_cfg, static_cast<int>(c.replicas),
                                                static_cast<int>(c.index));
        }
        std::vector<tensor> buffers;  // share the gradient buffers with the reducer
        for (auto& g : cs.grads) buffers.push_back(g.value);
        return buffers;
      },
      [self](std::vector<tensor>& buffers) { self->state.grad_buffers = std::move(buffers); });
  request_batches(self);
  return {
      [self](train_atom, int64_t step) -> caf::result<step_stats> {
        auto rp = self->make_response_promise<step_stats>();
        self->state.waiting_steps.emplace_back(step, rp);
        try_start(self);
        request_batches(self);
        return rp;
      },
      [self](eval_atom, tensor x, tensor y) -> caf::result<metric_sums> {
        auto rp = self->make_response_promise<metric_sums>();
        // With shards, on the variables pulled now.
        auto evaluate = [self, rp, x = std::move(x),
                         y = std::move(y)](std::vector<shard_values> pulled) mutable {
          on_device<metric_sums>(
              self,
              [x, y, pulled = std::move(pulled), place = self->state.cfg.place](compute_state& cs) {
                // With shards the model under test is theirs (elastic: the
                // center); this replica's own variables come back after.
                auto& vars = cs.net->variables();
                std::vector<tensor> own;
                for (auto& v : vars) own.push_back(v.value);
                if (!pulled.empty()) install_pulled(cs, place, pulled);
                auto r = cs.net->evaluate(x, y);
                for (std::size_t i = 0; i < vars.size(); ++i) vars[i].value = own[i];
                return metric_sums{r.loss_sum, r.correct, r.count};
              },
              [rp](metric_sums& m) mutable { rp.deliver(m); });
        };
        if (self->state.cfg.shards.empty())
          evaluate({});
        else
          pull_all(self,
                   [evaluate](std::vector<shard_values>& p) mutable { evaluate(std::move(p)); });
        return rp;
      },
      [self](metrics_atom, bool reset) -> metric_sums {
        auto m = self->state.train_metrics;
        if (reset) self->state.train_metrics = {};
        return m;
      },
      [self](state_atom) -> caf::result<model_state> {
        auto rp = self->make_response_promise<model_state>();
        auto snapshot = [self, rp]() mutable {
          on_device<model_state>(
              self,
              [](compute_state& cs) {
                model_state ms;
                for (auto& v : cs.net->variables())
                  ms.variables.push_back({v.name, v.value.clone()});
                ms.slots = cs.opt->state();
                return ms;
              },
              [rp](model_state& ms) mutable { rp.deliver(std::move(ms)); });
        };
        if (self->state.cfg.shard_optimizer)
          gather_slots(self, 0, snapshot);
        else
          snapshot();
        return rp;
      },
      [self](restore_atom, model_state ms) -> caf::result<int64_t> {
        auto rp = self->make_response_promise<int64_t>();
        on_device<int64_t>(
            self,
            [ms = std::move(ms)](compute_state& cs) {
              auto& vars = cs.net->variables();
              std::map<std::string, const tensor*> by_name;
              for (auto& v : ms.variables) by_name[v.name] = &v.value;
              for (auto& v : vars) {
                auto i = by_name.find(v.name);
                if (i == by_name.end())
                  throw std::runtime_error("checkpoint has no variable '" + v.name + "'");
                if (i->second->shape() != v.value.shape() || i->second->type() != v.value.type())
                  throw std::runtime_error("checkpoint variable '" + v.name + "' has shape " +
                                           shape_string(i->second->shape()) +
                                           ", the model expects " + shape_string(v.value.shape()));
              }
              if (by_name.size() != vars.size())
                throw std::runtime_error("checkpoint has " + std::to_string(by_name.size()) +
                                         " variables, the model has " +
                                         std::to_string(vars.size()));
              for (auto& v : vars) v.value = by_name[v.name]->clone();
              cs.opt->load_state(ms.slots);
              return cs.opt->step();
            },
            [rp](int64_t& step) mutable { rp.deliver(step); });
        return rp;
      },
      [self](computed_atom, uint64_t ticket) {
        auto& p = self->state.pending;
        auto i = p.find(ticket);
        if (i == p.end()) return;
        auto k = std::move(i->second);
        p.erase(i);
        k();
      },
  };
}

}  // namespace troupe
