#include "actors/learner.hpp"
#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <utility>

#include "actors/visible_mailbox.hpp"
#include "devices/device_context.hpp"
#include "models/device_policy.hpp"
#include "models/model.hpp"

namespace troupe {
namespace {

using self_ptr = learner_actor::stateful_pointer<learner_state>;

void fail(self_ptr self, const std::string& why) {
  const auto& c = self->state.cfg;
  const auto who = (c.member >= 0 ? "member " + std::to_string(c.member) + " " : std::string()) +
                   "learner " + std::to_string(c.index);
  spdlog::error("{}: {}", who, why);
  self->quit(caf::make_error(caf::sec::runtime_error, who + ": " + why));
}

std::vector<tensor> clone_values(const std::vector<named_tensor>& vars) {
  std::vector<tensor> out;
  out.reserve(vars.size());
  for (const auto& v : vars) out.push_back(v.value.clone());
  return out;
}

// Same variables, same order (the target network is built like the online one).
void copy_values(const std::vector<named_tensor>& from, std::vector<named_tensor>& to) {
  for (std::size_t i = 0; i < from.size(); ++i)
    std::copy(from[i].value.f32(), from[i].value.f32() + from[i].value.numel(), to[i].value.f32());
}

void maybe_compute(self_ptr self);
void stop(self_ptr self);

// After an update (or the exploit that followed it): stop when due, else on
// to the next update.
void next_update(self_ptr self, bool halting) {
  auto& st = self->state;
  st.phase = learner_phase::waiting;
  st.track.set("wait_for_batch", trace::category::wait);
  if (halting || (st.cfg.max_updates > 0 && st.version >= st.cfg.max_updates)) return stop(self);
  maybe_compute(self);
}

// rl.population's exploit: another member's variables and optimizer slots
// and new hyperparameters, between two updates (no update starts while it
// runs). The version goes on counting: the weights published next are newer
// than any the member's actors hold. A member of several learners is in
// lockstep (one all-reduce an update): each of them is sent the exploit, and
// they take it after the first update whose all-reduce counts every one of
// them holding it (learner_state::votes), so all take it after the same
// update and stay equal.
void adopt(self_ptr self, std::function<void()> then) {
  auto& st = self->state;
  auto ex = std::make_shared<pending_exploit>(std::move(*st.exploit));
  st.exploit.reset();
  const auto before = std::exchange(st.phase, learner_phase::updating);
  st.cfg.impala.entropy_cost = ex->hyperparameters.entropy_cost;
  st.tasks->submit(
      self, "exploit",
      [ex](learner_compute& lc) {
        restore_variables_and_slots(lc.net->variables(), *lc.opt, ex->state.variables,
                                    ex->state.slots);
        lc.opt->set_learning_rate(ex->hyperparameters.learning_rate);
      },
      [self, ex, before, then = std::move(then)] {
        self->state.phase = before;
        ex->done.deliver(self->state.version);
        then();
      });
}
void request_batch(self_ptr self);

// Ape-X: the next batch from the next shard in turn. A shard that holds
// fewer than its min_size transitions answers empty: the next shard is
// asked, and after a whole round of empty answers (replay warming up) the
// learner asks again a millisecond later instead of spinning.
void request_sample(self_ptr self) {
  auto& st = self->state;
  const auto shard = static_cast<std::size_t>(st.samples_requested++) % st.cfg.replay.size();
  self->request(st.cfg.replay[shard], caf::infinite, sample_atom::value, st.cfg.replay_batch)
      .then(
          [self, shard](replay_sample& s) {
            auto& st = self->state;
            st.batch_requested = false;
            if (s.ids.empty()) {
              if (++st.empty_samples % static_cast<int64_t>(st.cfg.replay.size()) == 0)
                self->delayed_send(self, std::chrono::milliseconds(1), run_atom::value);
              else
                request_batch(self);
              return;
            }
            st.empty_samples = 0;
            st.next_sample = replay_batch{shard, std::move(s)};
            maybe_compute(self);
          },
          [self](caf::error& e) { fail(self, "replay shard: " + describe(e)); });
}

// One dequeue outstanding at a time: the next batch arrives while the
// current one computes.
void request_batch(self_ptr self) {
  auto& st = self->state;
  if (st.batch_requested || st.next_batch || st.next_sample) return;
  st.batch_requested = true;
  if (!st.cfg.replay.empty()) return request_sample(self);
  // The queue answers when enough unrolls are there: no timeout (it is
  // monitored by the coordinator, which ends the job if it goes).
  self->request(st.cfg.queue, caf::infinite, dequeue_atom::value, st.cfg.batch_unrolls)
      .then(
          [self](std::vector<unroll>& b) {
            self->state.batch_requested = false;
            self->state.next_batch = std::move(b);
            maybe_compute(self);
          },
          [self](caf::error& e) { fail(self, "trajectory queue: " + describe(e)); });
}

void report(self_ptr self, const impala_figures& f, double norm) {
  auto& st = self->state;
  learner_report r;
  r.learner = st.cfg.index;
  r.member = std::max<int64_t>(st.cfg.member, 0);
  r.version = st.version;
  r.samples = st.cfg.global_samples;
  const double n = static_cast<double>(std::max<int64_t>(1, f.samples));
  r.loss = f.loss / n;
  r.policy_loss = f.policy_loss / n;
  r.baseline_loss = f.baseline_loss / n;
  r.entropy = f.entropy / n;
  r.grad_norm = norm;
  r.lag_mean = f.unrolls > 0 ? f.lag_sum / static_cast<double>(f.unrolls) : 0;
  r.lag_max = f.lag_max;
  self->send(st.cfg.coordinator, learned_atom::value, std::move(r));
}

// Clip and update on the device; learner 0 copies the weights when due;
// then the exploit, if `take_exploit` (every learner of the member holds it).
void apply(self_ptr self, std::shared_ptr<impala_figures> fig, bool halting, bool take_exploit) {
  auto& st = self->state;
  const bool publish =
      st.cfg.index == 0 && (st.cfg.inference || (st.version + 1) % st.cfg.weights_every == 0);
  const bool refresh_target = !st.cfg.replay.empty() && (st.version + 1) % st.cfg.target_every == 0;
  auto weights = std::make_shared<policy_weights>();
  auto norm = std::make_shared<double>(0);
  st.track.set("optimizer_update", trace::category::compute, st.version);
  st.tasks->submit(
      self, "optimizer_update",
      [clip = st.cfg.grad_clip, publish, refresh_target, weights, norm](learner_compute& lc) {
        *norm = clip_global_norm(lc.grads, clip);
        lc.opt->apply(lc.net->variables(), lc.grads);
        if (publish) weights->values = clone_values(lc.net->variables());
        if (refresh_target) copy_values(lc.net->variables(), lc.target->variables());
      },
      [self, fig, weights, norm, publish, halting, take_exploit] {
        auto& st = self->state;
        ++st.version;
        report(self, *fig, *norm);
        if (st.cfg.index == 0) self->send(st.cfg.queue, version_atom::value, st.version);
        if (publish) {
          weights->version = st.version;
          weights->member = std::max<int64_t>(st.cfg.member, 0);
          if (st.cfg.inference)
            self->send(st.cfg.inference, weights_atom::value, std::move(*weights));
          else
            self->send(st.cfg.coordinator, weights_atom::value, std::move(*weights));
        }
        if (st.exploit && take_exploit)
          return adopt(self, [self, halting] { next_update(self, halting); });
        next_update(self, halting);
      });
}

// With several learners, every learner's gradients are summed over all of
// them (each is already divided by the global batch: the sum is the mean).
void reduce(self_ptr self, std::shared_ptr<impala_figures> fig) {
  auto& st = self->state;
  if (!st.cfg.reducer) {
    apply(self, std::move(fig), st.halt_vote, true);
    return;
  }
  // The votes to stop, and the exploit's, travel with the gradients.
  st.votes.f32()[0] = st.halt_vote ? 1.0f : 0.0f;
  st.votes.f32()[1] = st.exploit ? 1.0f : 0.0f;
  auto buffers = st.grad_buffers;
  buffers.push_back(st.votes);
  st.track.set("all_reduce", trace::category::communicate, st.version);
  trace::note_step(st.cfg.index, st.version);
  self->request(st.cfg.reducer, st.cfg.request_timeout, allreduce_atom::value, reduce_op::sum,
                std::move(buffers))
      .then(
          [self, fig](std::vector<tensor>&) {
            auto& st = self->state;
            const auto holders = static_cast<int64_t>(std::lround(st.votes.f32()[1]));
            apply(self, fig, st.votes.f32()[0] > 0, holders == st.cfg.learners);
          },
          [self](caf::error& e) { fail(self, "all-reduce of the gradients: " + describe(e)); });
}

void stop(self_ptr self) {
  auto& st = self->state;
  st.phase = learner_phase::stopped;
  if (st.exploit) {  // its other learners stopped before holding it too
    st.exploit->done.deliver(
        caf::make_error(caf::sec::runtime_error, "stopped before the exploit landed"));
    st.exploit.reset();
  }
  for (auto& rp : std::exchange(st.halted, {})) rp.deliver(st.version);
}

// Ape-X: double-DQN gradients on a sampled batch; the new priorities go
// back to its shard as soon as they are known.
void compute_dqn(self_ptr self) {
  auto& st = self->state;
  auto batch = std::make_shared<replay_batch>(std::move(*st.next_sample));
  st.next_sample.reset();
  request_batch(self);
  auto fig = std::make_shared<impala_figures>();
  auto update = std::make_shared<priority_update>();
  st.track.set("dqn_gradients", trace::category::compute, st.version);
  st.tasks->submit(
      self, "dqn_gradients",
      [batch, fig, update, A = st.cfg.actions,
       global = st.cfg.global_samples](learner_compute& lc) {
        const auto& s = batch->sample;
        update->priorities.resize(s.ids.size());
        auto f = double_dqn_gradients(*lc.net, *lc.target, A, s.transitions, s.weights.f32(),
                                      global, lc.grads, update->priorities.data(), lc.dqn);
        // Reported as the learner's loss: the weighted TD loss; its
        // "baseline" the mean Q-value.
        fig->samples = f.samples;
        fig->loss = fig->policy_loss = f.loss;
        fig->baseline_loss = f.q_mean;
      },
      [self, batch, fig, update] {
        auto& st = self->state;
        update->ids = std::move(batch->sample.ids);
        self->send(st.cfg.replay[batch->shard], priority_atom::value, std::move(*update));
        reduce(self, fig);
      });
}

void maybe_compute(self_ptr self) {
  auto& st = self->state;
  if (st.phase != learner_phase::waiting || !(st.next_batch || st.next_sample)) return;
  if (st.version + 1 == st.cfg.fail_at_update)
    return fail(self, "test hook: failing at update " + std::to_string(st.version + 1));
  st.phase = learner_phase::updating;
  if (st.next_sample) return compute_dqn(self);
  auto batch = std::make_shared<std::vector<unroll>>(std::move(*st.next_batch));
  st.next_batch.reset();
  request_batch(self);
  auto fig = std::make_shared<impala_figures>();
  st.track.set("impala_gradients", trace::category::compute, st.version);
  st.tasks->submit(
      self, "impala_gradients",
      [batch, fig, version = st.version, s = st.cfg.impala,
       global = st.cfg.global_samples](learner_compute& lc) {
        *fig = impala_gradients(*lc.net, *batch, s, global, version, lc.grads, lc.ws);
      },
      [self, fig] { reduce(self, fig); });
}

// rl.population: an exploit waits for the update in flight to end; with
// several learners a member, for the update that all of them vote for.
caf::result<int64_t> take_exploit(self_ptr self, model_state& ms, member_hyperparameters hp) {
  auto& st = self->state;
  auto rp = self->make_response_promise<int64_t>();
  if (st.exploit) st.exploit->done.deliver(caf::make_error(caf::sec::runtime_error, "superseded"));
  if (st.phase == learner_phase::stopped) {
    rp.deliver(caf::make_error(caf::sec::runtime_error, "stopped before the exploit landed"));
    return rp;
  }
  st.exploit = pending_exploit{std::move(ms), hp, rp};
  if (st.phase != learner_phase::updating && !st.cfg.reducer)
    adopt(self, [self] { maybe_compute(self); });
  return rp;
}

// The entropy cost from the next batch's gradients on, the learning rate
// from the next optimizer update (a device task after those queued).
void set_hyperparameters(self_ptr self, member_hyperparameters hp) {
  auto& st = self->state;
  st.cfg.impala.entropy_cost = hp.entropy_cost;
  st.tasks->submit(
      self, [lr = hp.learning_rate](learner_compute& lc) { lc.opt->set_learning_rate(lr); }, [] {});
}

}  // namespace

learner_actor::behavior_type learner(self_ptr self, learner_config cfg) {
  keep_exception_cause(self, "learner " + std::to_string(cfg.index));
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.track.open("learner:" + std::to_string(st.cfg.index));
  st.track.set("wait_for_batch", trace::category::wait);
  st.compute = std::make_shared<learner_compute>();
  st.tasks = std::make_unique<device_tasks<learner_compute>>(
      st.cfg.device, st.compute, [self](const std::string& why) { fail(self, why); });
  auto buffers = std::make_shared<std::vector<tensor>>();
  // Built on its device thread: its memory is first touched there.
  st.tasks->submit(
      self,
      [c = st.cfg, buffers](learner_compute& lc) {
        // On a discrete device (sim:N, cuda:N) the network computes there.
        auto ctx = discrete_device_context(c.device->name());
        auto build = [&c, &ctx] {
          const auto head = c.head ? *c.head : policy_head{action_distribution::softmax, c.actions};
          return create_policy_value_model_on(ctx, c.model, c.observation_size, head, c.seed);
        };
        lc.net = build();
        lc.opt = std::make_unique<kernels::optimizer>(c.optimizer, c.total_updates);
        lc.opt->init(lc.net->variables());
        lc.grads = lc.net->make_gradients();
        for (auto& g : lc.grads) buffers->push_back(g.value);
        // The same seed builds the same initial weights: the target starts equal.
        if (!c.replay.empty()) lc.target = build();
      },
      [self, buffers] { self->state.grad_buffers = std::move(*buffers); });
  return {
      [self](run_atom) {
        auto& st = self->state;
        if (st.phase == learner_phase::built) st.phase = learner_phase::waiting;
        request_batch(self);
      },
      [self](state_atom) -> caf::result<model_state> {
        auto rp = self->make_response_promise<model_state>();
        auto ms = std::make_shared<model_state>();
        self->state.tasks->submit(
            self,
            [ms](learner_compute& lc) {
              for (const auto& v : lc.net->variables())
                ms->variables.push_back({v.name, v.value.clone()});
              ms->slots = lc.opt->state();
            },
            [rp, ms]() mutable { rp.deliver(std::move(*ms)); });
        return rp;
      },
      [self](restore_atom, model_state& ms) -> caf::result<int64_t> {
        auto rp = self->make_response_promise<int64_t>();
        auto in = std::make_shared<model_state>(std::move(ms));
        auto version = std::make_shared<int64_t>(0);
        self->state.tasks->submit(
            self,
            [in, version](learner_compute& lc) {
              *version = restore_variables_and_slots(lc.net->variables(), *lc.opt, in->variables,
                                                     in->slots);
            },
            [self, rp, version]() mutable {
              self->state.version = *version;
              rp.deliver(*version);
            });
        return rp;
      },
      [self](weights_atom) -> caf::result<policy_weights> {
        auto rp = self->make_response_promise<policy_weights>();
        auto pw = std::make_shared<policy_weights>();
        self->state.tasks->submit(
            self, [pw](learner_compute& lc) { pw->values = clone_values(lc.net->variables()); },
            [self, rp, pw]() mutable {
              pw->version = self->state.version;
              rp.deliver(std::move(*pw));
            });
        return rp;
      },
      [self](exploit_atom, model_state& ms, member_hyperparameters hp) {
        return take_exploit(self, ms, hp);
      },
      [self](hyperparameters_atom, member_hyperparameters hp) { set_hyperparameters(self, hp); },
      [self](halt_atom) -> caf::result<int64_t> {
        auto& st = self->state;
        if (st.phase == learner_phase::stopped) return st.version;
        st.halt_vote = true;
        auto rp = self->make_response_promise<int64_t>();
        st.halted.push_back(rp);
        return rp;
      },
      [self](computed_atom, uint64_t ticket) { self->state.tasks->computed(ticket); },
  };
}

learner_actor spawn_learner(caf::actor_system& sys, learner_config cfg) {
  return spawn_visible<learner_actor, learner_state, learner_config>(sys, learner, std::move(cfg));
}

}  // namespace troupe
