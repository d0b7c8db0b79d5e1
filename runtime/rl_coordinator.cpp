#include "runtime/rl_coordinator.hpp"
#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <numeric>

#include "actors/fan_in.hpp"
#include "envs/env.hpp"
#include "runtime/checkpointing.hpp"

namespace troupe {

double mean_recent_return(const std::deque<double>& recent) {
  if (recent.empty()) return 0;
  return std::accumulate(recent.begin(), recent.end(), 0.0) / static_cast<double>(recent.size());
}

namespace {

using self_ptr = rl_coordinator_actor::stateful_pointer<rl_coordinator_state>;
using clock_type = std::chrono::steady_clock;
constexpr std::size_t kWindow = 100;  // episodes in the mean return

double elapsed(self_ptr self) {
  return std::chrono::duration<double>(clock_type::now() - self->state.started).count();
}

void write_metrics(self_ptr self, const nlohmann::json& j) {
  self->state.metrics << j.dump() << '\n';
  self->state.metrics.flush();
}

void fail(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  spdlog::error("job failed: {}", why);
  if (st.done.pending()) st.done.deliver(caf::make_error(caf::sec::runtime_error, why));
  self->quit(caf::make_error(caf::sec::runtime_error, why));
}

bool solved(const rl_coordinator_state& st) {
  const auto& target = st.plan->config.training.target_return;
  return target && st.recent.size() >= kWindow && st.env_steps >= st.min_env_steps_to_solve &&
         mean_recent_return(st.recent) >= *target;
}

int64_t live_actors(const rl_coordinator_state& st) {
  int64_t n = 0;
  for (const auto& a : st.actors) n += a ? 1 : 0;
  return n;
}

// The step count a learner's state was saved at ("optimizer/step").
int64_t saved_version(const model_state& ms, int64_t fallback) {
  for (const auto& s : ms.slots)
    if (s.name == "optimizer/step" && s.value.type() == dtype::i64 && s.value.numel() == 1)
      return s.value.data<int64_t>()[0];
  return fallback;
}

nlohmann::json resume_extra(const rl_coordinator_state& st) {
  return {{"env_steps", st.env_steps},
          {"episodes", st.episodes},
          {"samples", st.samples},
          {"recent_returns", std::vector<double>(st.recent.begin(), st.recent.end())}};
}

// Writes a checkpoint of learner 0's state, then calls k (also when the
// write failed: the job fails then, and k does nothing more).
void checkpoint(self_ptr self, std::function<void()> k) {
  auto& st = self->state;
  st.checkpointing = true;
  self->request(st.learners.front(), st.plan->request_timeout, state_atom::value)
      .then(
          [self, k](model_state& ms) {
            auto& st = self->state;
            st.checkpointing = false;
            const int64_t step = saved_version(ms, st.updates);
            try {
              st.last_checkpoint = save_job_checkpoint(*st.plan, step, ms, resume_extra(st));
            } catch (const std::exception& e) {
              fail(self, std::string("writing checkpoint failed: ") + e.what());
              return;
            }
            write_metrics(self, {{"type", "checkpoint"},
                                 {"step", step},
                                 {"env_steps", st.env_steps},
                                 {"path", st.last_checkpoint}});
            k();
          },
          [self](caf::error& e) { fail(self, "checkpoint: learner 0: " + describe(e)); });
}

void finish(self_ptr self) {
  auto& st = self->state;
  if (st.finished) return;
  const auto& p = *st.plan;
  const double wall = elapsed(self);
  const double mean = mean_recent_return(st.recent);
  nlohmann::json s{
      {"job", p.config.name},
      {"strategy", p.config.strategy.kind},
      {"env", p.config.rl.env},
      {"learners", st.learners.size()},
      {"actors", st.actors.size()},
      {"actors_live", live_actors(st)},
      {"steps", st.updates},
      {"updates", st.updates},
      {"env_steps", st.env_steps},
      {"episodes", st.episodes},
      {"samples", st.samples},
      {"mean_return_100", mean},
      {"best_mean_return_100", st.episodes > 0 ? st.best_mean_return : 0.0},
      {"solved", st.time_to_solve >= 0},
      {"time_to_solve_seconds",
       st.time_to_solve >= 0 ? nlohmann::json(st.time_to_solve) : nlohmann::json()},
      {"env_steps_to_solve",
       st.time_to_solve >= 0 ? nlohmann::json(st.env_steps_to_solve) : nlohmann::json()},
      {"stop_reason", st.stop_reason},
      {"wall_seconds", wall},
      {"env_steps_per_second",
       static_cast<double>(st.env_steps - st.start_env_steps) / std::max(wall, 1e-9)},
      {"updates_per_second",
       static_cast<double>(st.updates - st.start_updates) / std::max(wall, 1e-9)},
      {"output_dir", p.output_dir}};
  if (p.config.training.target_return) s["target_return"] = *p.config.training.target_return;
  if (!st.last_checkpoint.empty()) s["checkpoint"] = st.last_checkpoint;
  write_metrics(self, {{"type", "summary"}, {"summary", s}});
  st.finished = true;
  st.done.deliver(s.dump());
  self->quit();
}

// Every learner stops after the same update (they vote with their
// gradients), then the actors stop, then the checkpoint at the end.
void stop(self_ptr self, std::string reason) {
  auto& st = self->state;
  if (st.stopping || st.finished) return;
  st.stopping = true;
  st.stop_reason = std::move(reason);
  spdlog::info("stopping: {}", st.stop_reason);
  fan_in<int64_t> halted(
      st.learners.size(),
      [self](std::vector<int64_t>& versions) {
        auto& st = self->state;
        st.updates = versions.front();
        for (auto& a : st.actors)
          if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
        if (st.plan->config.checkpoint.save_at_end)
          checkpoint(self, [self] { finish(self); });
        else
          finish(self);
      },
      [self](caf::error& e) { fail(self, "stopping the learners: " + describe(e)); });
  for (std::size_t i = 0; i < st.learners.size(); ++i)
    self->request(st.learners[i], st.plan->request_timeout, halt_atom::value)
        .then(halted.reply(i), halted.error());
}

void metrics_line(self_ptr self) {
  auto& st = self->state;
  auto& iv = st.since;
  const double now = elapsed(self);
  const double dt = std::max(now - iv.t, 1e-9);
  const double n = static_cast<double>(std::max<int64_t>(iv.reports, 1));
  const double mean = mean_recent_return(st.recent);
  nlohmann::json line{{"type", "train"},
                      {"step", st.updates},
                      {"env_steps", st.env_steps},
                      {"episodes", st.episodes},
                      {"mean_return_100", mean},
                      {"loss", iv.loss / n},
                      {"policy_loss", iv.policy_loss / n},
                      {"baseline_loss", iv.baseline_loss / n},
                      {"entropy", iv.entropy / n},
                      {"grad_norm", iv.grad_norm / n},
                      {"policy_lag_mean", iv.lag / n},
                      {"policy_lag_max", iv.lag_max},
                      {"queue_depth", st.last_queue.depth},
                      {"unrolls_dropped_stale", st.last_queue.dropped_stale},
                      {"env_steps_per_second", static_cast<double>(iv.env_steps) / dt},
                      {"updates_per_second", static_cast<double>(iv.updates) / dt},
                      {"samples_per_second", static_cast<double>(iv.samples) / dt},
                      {"actors_live", live_actors(st)},
                      {"elapsed_seconds", now}};
  write_metrics(self, line);
  if (st.plan->options.on_progress) {
    progress_info pi;
    pi.step = st.updates;
    pi.total_steps = st.plan->config.training.max_steps;
    pi.loss = iv.loss / n;
    pi.samples_per_second = static_cast<double>(iv.samples) / dt;
    pi.elapsed_seconds = now;
    pi.rl = true;
    pi.env_steps = st.env_steps;
    pi.max_env_steps = st.plan->config.training.max_env_steps;
    pi.mean_return = mean;
    pi.episodes = st.episodes;
    pi.env_steps_per_second = static_cast<double>(iv.env_steps) / dt;
    st.plan->options.on_progress(pi);
  }
  iv = {};
  iv.t = now;
  self->request(st.queue, st.plan->request_timeout, stats_atom::value)
      .then([self](queue_stats& q) { self->state.last_queue = q; }, [](caf::error&) {});
}

// After every report: stop, checkpoint, or go on.
void check(self_ptr self) {
  auto& st = self->state;
  if (!st.running || st.stopping || st.finished) return;
  const auto& t = st.plan->config.training;
  if (solved(st) && st.time_to_solve < 0) {
    st.time_to_solve = elapsed(self);
    st.env_steps_to_solve = st.env_steps;
    spdlog::info(
        "solved: mean return of the last 100 episodes {:.1f} >= {} after {} env steps, "
        "{:.2f} s",
        mean_recent_return(st.recent), *t.target_return, st.env_steps, st.time_to_solve);
    stop(self, "target_return");
    return;
  }
  if (t.max_env_steps > 0 && st.env_steps >= t.max_env_steps) return stop(self, "max_env_steps");
  if (t.max_steps > 0 && st.updates >= t.max_steps) return stop(self, "max_steps");
  const auto every = st.plan->config.checkpoint.every_steps;
  if (every > 0 && !st.checkpointing && st.updates >= st.next_checkpoint) {
    st.next_checkpoint = (st.updates / every + 1) * every;
    checkpoint(self, [] {});
  }
}

void on_learned(self_ptr self, const learner_report& r) {
  auto& st = self->state;
  // Learners update in lockstep: learner 0 speaks for them. Updates that
  // finish while the learners stop still count.
  if (r.learner != 0 || st.finished) return;
  // As the classifier's coordinator: a diverged job stops at once, naming
  // the update, instead of acting on a NaN policy to the end.
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    return fail(self, fmt::format("training diverged at update {}: loss {:g}, gradient norm {:g} "
                                  "(a lower optimizer.learning_rate or rl.grad_clip may help)",
                                  r.version, r.loss, r.grad_norm));
  st.updates = r.version;
  st.samples += r.samples;
  auto& iv = st.since;
  ++iv.updates;
  ++iv.reports;
  iv.samples += r.samples;
  iv.loss += r.loss;
  iv.policy_loss += r.policy_loss;
  iv.baseline_loss += r.baseline_loss;
  iv.entropy += r.entropy;
  iv.grad_norm += r.grad_norm;
  iv.lag += r.lag_mean;
  iv.lag_max = std::max(iv.lag_max, r.lag_max);
  if (st.updates % st.plan->config.logging.every_steps == 0) metrics_line(self);
  check(self);
}

void on_episodes(self_ptr self, const episode_report& r) {
  auto& st = self->state;
  // The figures are the job's at its stop; unrolls acted while the learners
  // halt are not counted (their episodes would move the mean after it was
  // judged).
  if (st.stopping || st.finished) return;
  st.env_steps += r.env_steps;
  st.since.env_steps += r.env_steps;
  for (double ret : r.returns) {
    st.recent.push_back(ret);
    if (st.recent.size() > kWindow) st.recent.pop_front();
    ++st.episodes;
    if (st.recent.size() >= std::min<std::size_t>(kWindow, 10))
      st.best_mean_return = std::max(st.best_mean_return, mean_recent_return(st.recent));
  }
  check(self);
}

void send_weights(self_ptr self, const rl_actor_actor& a) {
  auto& st = self->state;
  if (st.latest) self->send(a, weights_atom::value, *st.latest);
}

// Every actor gets the first weights, then everyone starts.
void start(self_ptr self) {
  auto& st = self->state;
  self->request(st.learners.front(), st.plan->request_timeout, weights_atom::value)
      .then(
          [self](policy_weights& w) {
            auto& st = self->state;
            st.latest = std::move(w);
            st.started = clock_type::now();
            st.running = true;
            const auto every = st.plan->config.checkpoint.every_steps;
            if (every > 0) st.next_checkpoint = (st.updates / every + 1) * every;
            for (auto& a : st.actors)
              if (a) {
                send_weights(self, a);
                self->send(a, run_atom::value);
              }
            for (auto& l : st.learners) self->send(l, run_atom::value);
            spdlog::info("actor/learner job running: {} learners, {} rl_actors on {}",
                         st.learners.size(), live_actors(st), st.plan->config.rl.env);
          },
          [self](caf::error& e) { fail(self, "learner 0: " + describe(e)); });
}

// Every learner restores the checkpoint; the counters come back from it.
void restore(self_ptr self) {
  auto& st = self->state;
  const auto& snap = *st.plan->resume_from;
  const auto& x = snap.meta.extra;
  if (x.is_object()) {
    st.env_steps = x.value("env_steps", int64_t{0});
    st.episodes = x.value("episodes", int64_t{0});
    st.samples = x.value("samples", int64_t{0});
    if (auto it = x.find("recent_returns"); it != x.end() && it->is_array())
      for (const auto& v : *it)
        if (v.is_number()) st.recent.push_back(v.get<double>());
    while (st.recent.size() > kWindow) st.recent.pop_front();
  }
  st.start_env_steps = st.env_steps;
  model_state ms{snap.variables, snap.slots};
  fan_in<int64_t> restored(
      st.learners.size(),
      [self](std::vector<int64_t>& versions) {
        auto& st = self->state;
        st.updates = st.start_updates = versions.front();
        spdlog::info("resumed at update {}, {} env steps", st.updates, st.env_steps);
        start(self);
      },
      [self](caf::error& e) {
        fail(self,
             "restoring checkpoint " + self->state.plan->resume_from->dir + ": " + describe(e));
      });
  for (std::size_t i = 0; i < st.learners.size(); ++i)
    self->request(st.learners[i], st.plan->request_timeout, restore_atom::value, ms)
        .then(restored.reply(i), restored.error());
}

void on_down(self_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.finished) return;
  const auto cause = dm.reason ? describe(dm.reason) : std::string("exited");
  for (std::size_t i = 0; i < st.actors.size(); ++i) {
    if (st.actors[i] && st.actors[i].address() == dm.source) {
      if (st.stopping) return;  // stopped by the coordinator itself
      st.actors[i] = nullptr;
      spdlog::warn("rl_actor {} lost ({}); {} of {} actors go on", i, cause, live_actors(st),
                   st.actors.size());
      write_metrics(self, {{"type", "actor_lost"},
                           {"actor", i},
                           {"cause", cause},
                           {"step", st.updates},
                           {"actors_live", live_actors(st)}});
      if (live_actors(st) == 0)
        fail(self, "every rl_actor is lost (the last: rl_actor " + std::to_string(i) + ": " +
                       cause + ")");
      return;
    }
  }
  for (std::size_t i = 0; i < st.learners.size(); ++i)
    if (st.learners[i].address() == dm.source)
      return fail(self, "learner " + std::to_string(i) + " stopped: " + cause);
  if (st.queue.address() == dm.source) return fail(self, "trajectory queue stopped: " + cause);
}

}  // namespace

rl_coordinator_actor::behavior_type rl_coordinator(self_ptr self,
                                                   std::shared_ptr<const job_plan> plan) {
  // An exception in the coordinator's own code fails the job with its
  // message; CAF's default would leave run's promise unanswered for ever.
  self->set_exception_handler([self](std::exception_ptr& x) {
    auto err = exception_exit_reason("rl coordinator", x);
    auto& st = self->state;
    if (!st.finished) {
      st.finished = true;
      if (st.done.pending()) st.done.deliver(err);
    }
    return err;
  });
  auto& st = self->state;
  st.plan = std::move(plan);
  st.started = clock_type::now();
  const auto& rl = st.plan->config.rl;
  st.min_env_steps_to_solve =
      rl.actors * rl.envs_per_actor * envs::make_env(rl.env, 1)->spec().max_episode_steps;
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  st.metrics.open(std::filesystem::path(st.plan->output_dir) / "metrics.jsonl",
                  st.plan->resume_from ? std::ios::app : std::ios::trunc);
  return {
      [self](run_atom, std::vector<learner_actor>& learners, std::vector<rl_actor_actor>& actors,
             trajectory_queue_actor& queue) -> caf::result<std::string> {
        auto& st = self->state;
        st.done = self->make_response_promise<std::string>();
        if (learners.empty()) {
          fail(self, "an actor/learner job needs at least one learner");
          return st.done;
        }
        st.learners = std::move(learners);
        st.actors = std::move(actors);
        st.queue = std::move(queue);
        for (auto& l : st.learners) self->monitor(l);
        for (auto& a : st.actors)
          if (a) self->monitor(a);
        self->monitor(st.queue);
        if (st.plan->resume_from)
          restore(self);
        else
          start(self);
        return st.done;
      },
      [self](episodes_atom, episode_report& r) { on_episodes(self, r); },
      [self](learned_atom, learner_report& r) { on_learned(self, r); },
      [self](weights_atom, policy_weights& w) {
        auto& st = self->state;
        st.latest = std::move(w);
        for (auto& a : st.actors)
          if (a) send_weights(self, a);
      },
      [self](rejoin_atom, int64_t index, caf::actor& handle) {
        auto& st = self->state;
        auto a = caf::actor_cast<rl_actor_actor>(handle);
        if (st.finished || st.stopping || index < 0 || !a) return;
        if (static_cast<std::size_t>(index) >= st.actors.size())
          st.actors.resize(static_cast<std::size_t>(index) + 1);
        auto& slot = st.actors[static_cast<std::size_t>(index)];
        if (slot && slot != a) self->demonitor(slot.address());
        slot = a;
        self->monitor(a);
        spdlog::info("rl_actor {} joined; {} actors live", index, live_actors(st));
        write_metrics(self, {{"type", "actor_joined"},
                             {"actor", index},
                             {"step", st.updates},
                             {"actors_live", live_actors(st)}});
        if (st.running) {
          send_weights(self, a);
          self->send(a, run_atom::value);
        }
      },
  };
}

}  // namespace troupe
