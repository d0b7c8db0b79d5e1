#include "runtime/coordinator.hpp"
#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "runtime/checkpointing.hpp"
#include "strategies/strategy.hpp"

namespace troupe {
namespace {

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

void write_metrics(self_ptr self, const nlohmann::json& j) {
  trace::scoped_span span(self->state.track, "write_metrics", trace::category::io);
  self->state.metrics << j.dump() << '\n';
  self->state.metrics.flush();
}

void fail(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  spdlog::error("job failed: {}", why);
  st.done.deliver(caf::make_error(caf::sec::runtime_error, why));
  self->quit(caf::make_error(caf::sec::runtime_error, why));
}

// The next update at which the job stops issuing and does boundary work:
// the end of an epoch (strategies with epochs), a checkpoint, a replica check.
int64_t next_boundary(const job_plan& p, int64_t completed) {
  int64_t b = p.total_steps;
  for (int64_t e :
       {p.steps_per_epoch, p.config.checkpoint.every_steps, p.config.strategy.check_replicas_every})
    if (e > 0) b = std::min(b, (completed / e + 1) * e);
  return b;
}

int64_t epoch_of(const job_plan& p, int64_t completed) {
  return p.steps_per_epoch > 0 ? (completed - 1) / p.steps_per_epoch : 0;
}

void pump(self_ptr self);
void at_boundary(self_ptr self);
void step_done(self_ptr self, const step_stats& sum);
void steps_given_up(self_ptr self);

}  // namespace

class coordinator_host_impl final : public coordinator_host {
 public:
  explicit coordinator_host_impl(self_ptr self) : self_(self) {}
  coordinator_actor::pointer self() override { return self_; }
  const job_plan& plan() const override { return *self_->state.plan; }
  std::vector<replica_actor>& replicas() override { return self_->state.replicas; }
  const std::vector<replica_actor>& replicas() const override { return self_->state.replicas; }
  const shard_set& shards() const override { return self_->state.shards; }
  int64_t& issued() override { return self_->state.issued; }
  int64_t completed() const override { return self_->state.completed; }
  int64_t boundary() const override { return self_->state.boundary; }
  bool finished() const override { return self_->state.finished; }
  void step_done(const step_stats& s) override { troupe::step_done(self_, s); }
  void steps_given_up() override { troupe::steps_given_up(self_); }
  void write_metrics(const nlohmann::json& line) override { troupe::write_metrics(self_, line); }
  void fail(const std::string& why) override { troupe::fail(self_, why); }
  std::vector<replica_actor> live_replicas() const override {
    return self_->state.driver->live(*this);
  }
  nlohmann::json& summary_extras() override { return self_->state.shard_summary; }

 private:
  self_ptr self_;
};

coordinator_state::coordinator_state() = default;

coordinator_state::~coordinator_state() = default;

namespace {

const strategy& strategy_of(self_ptr self) {
  return *self->state.plan->strat;
}

// Books a finished update (all replicas' parts of a lockstep step, or one
// worker's push): progress, metrics lines, and the next steps or a boundary.
void step_done(self_ptr self, const step_stats& sum) {
  auto& st = self->state;
  if (st.finished) return;
  ++st.completed;
  st.samples += sum.count;
  // A diverged job stops at once, saying so, instead of training on NaN to
  // the end (and leaving NaN checkpoints and metrics behind).
  if (!std::isfinite(sum.loss_sum))
    return fail(self, "training diverged: the loss is " + std::to_string(sum.loss_sum) +
                          " at step " + std::to_string(st.completed) +
                          " (a lower optimizer.learning_rate, or a gradient clip, may help)");
  st.window_loss += sum.loss_sum;
  st.window_count += sum.count;
  const auto& p = *st.plan;
  if (st.completed % p.config.logging.every_steps == 0 || st.completed == st.boundary) {
    double win = seconds_since(st.window_start);
    progress_info pi;
    pi.step = st.completed;
    pi.total_steps = p.total_steps;
    pi.epoch = epoch_of(p, st.completed);
    pi.epochs = p.config.training.epochs;
    pi.loss = st.window_count ? st.window_loss / static_cast<double>(st.window_count) : 0;
    pi.samples_per_second = win > 0 ? static_cast<double>(st.window_count) / win : 0;
    pi.elapsed_seconds = seconds_since(st.started);
    double lr = strategy_of(self).reported_lr(p, st.completed, sum);
    write_metrics(self, {{"type", "step"},
                         {"step", pi.step},
                         {"epoch", pi.epoch},
                         {"loss", pi.loss},
                         {"lr", lr},
                         {"samples_per_second", pi.samples_per_second},
                         {"elapsed_seconds", pi.elapsed_seconds}});
    if (p.options.on_progress) p.options.on_progress(pi);
    st.window_loss = 0;
    st.window_count = 0;
    st.window_start = clock_type::now();
  }
  const auto& o = p.options;
  if (o.fail_shard >= 0 && o.fail_shard < static_cast<int64_t>(st.shards.actors.size()) &&
      st.completed == o.fail_shard_at_step)
    self->send_exit(st.shards.actors[static_cast<std::size_t>(o.fail_shard)],
                    caf::make_error(caf::sec::runtime_error, "injected failure"));
  if (st.completed == st.boundary)
    at_boundary(self);
  else
    pump(self);
}

void steps_given_up(self_ptr self) {
  auto& st = self->state;
  if (st.issued == st.completed && st.completed == st.boundary)
    at_boundary(self);
  else
    pump(self);
}

void pump(self_ptr self) {
  auto& st = self->state;
  if (st.finished) return;
  st.driver->pump(*st.host);
}

// Reads the replicas' sync-on-read training metrics (resetting them), then
// evaluates when due, then calls k.
void end_epoch(self_ptr self, std::function<void()> k) {
  auto& st = self->state;
  const auto& p = *st.plan;
  int64_t epoch = epoch_of(p, st.completed);
  auto live = st.host->live_replicas();
  fan_in<metric_sums> sums(
      live.size(),
      [self, epoch, k](std::vector<metric_sums>& all) {
        auto& st = self->state;
        const auto& p = *st.plan;
        metric_sums tm;
        for (const auto& m : all) {
          tm.loss_sum += m.loss_sum;
          tm.correct += m.correct;
          tm.count += m.count;
        }
        // Time at the epoch's last step (before its evaluation), on the same
        // clock as the train lines, so accuracy can be plotted against time.
        nlohmann::json line{{"type", "epoch"},
                            {"epoch", epoch},
                            {"step", st.completed},
                            {"elapsed_seconds", seconds_since(st.started)}};
        if (tm.count > 0) {
          line["train_loss"] = tm.loss_sum / static_cast<double>(tm.count);
          line["train_accuracy"] = static_cast<double>(tm.correct) / static_cast<double>(tm.count);
        }
        int64_t every = p.config.training.eval_every_epochs;
        bool last = st.completed == p.total_steps;
        bool due = last || (every > 0 && (epoch + 1) % every == 0);
        strategy_of(self).on_epoch_end(*st.host, epoch);
        auto report = [self, k](nlohmann::json line) {
          write_metrics(self, line);
          const auto& p = *self->state.plan;
          if (p.options.on_epoch) p.options.on_epoch(line);
          k();
        };
        if (!due) {
          report(std::move(line));
          return;
        }
        // The coordinator waits while the replicas evaluate on their devices.
        const double eval_begin = trace::enabled() ? trace::now_us() : 0;
        strategy_of(self).evaluate(
            *st.host, [self, line, report, eval_begin](nlohmann::json figures) mutable {
              trace::complete(self->state.track, "evaluate", trace::category::wait, eval_begin,
                              trace::now_us());
              if (!figures.empty()) {
                self->state.last_eval = figures;
                line.update(figures);
              }
              report(std::move(line));
            });
      },
      st.host->failed("reading metrics failed"));
  for (std::size_t i = 0; i < live.size(); ++i)
    self->request(live[i], st.plan->request_timeout, metrics_atom::value, true)
        .then(sums.reply(i), sums.error());
}

void save_checkpoint(self_ptr self, std::function<void()> k) {
  strategy_of(self).snapshot(*self->state.host, [self, k](model_state& ms) {
    auto& st = self->state;
    trace::scoped_span span(st.track, "checkpoint_write", trace::category::io,
                            {st.completed, -1, -1});
    auto path = write_checkpoint(*st.host, st.completed, ms);
    if (!path) return;  // the host failed the job
    st.last_checkpoint = *path;
    k();
  });
}

// Replicas that must hold bit-identical variables: compare them all with
// replica 0, and end the job naming the first variable that differs.
void check_replicas(self_ptr self, std::function<void()> k) {
  collect_replica_states(*self->state.host, [self, k](std::vector<model_state>& states) {
    const auto& ref = states[0].variables;
    for (std::size_t r = 1; r < states.size(); ++r) {
      const auto& vars = states[r].variables;
      for (std::size_t v = 0; v < ref.size(); ++v) {
        if (vars.at(v).value == ref[v].value) continue;
        double worst = 0;
        auto a = ref[v].value.span<float>();
        auto b = vars[v].value.span<float>();
        for (std::size_t j = 0; j < a.size(); ++j)
          worst = std::max(worst, std::abs(double(a[j]) - double(b[j])));
        fail(self, "replicas diverged at step " + std::to_string(self->state.completed) +
                       ": variable '" + ref[v].name + "' differs between replica 0 and replica " +
                       std::to_string(r) + " (max abs difference " + std::to_string(worst) + ")");
        return;
      }
    }
    spdlog::debug("step {}: {} replicas hold identical variables", self->state.completed,
                  states.size());
    k();
  });
}

void finish(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  double wall = seconds_since(st.started);
  double train_seconds = std::max(1e-9, wall - st.boundary_seconds);
  nlohmann::json s{{"job", p.config.name},
                   {"strategy", p.config.strategy.kind},
                   {"replicas", st.replicas.size()},
                   {"steps", st.completed},
                   {"steps_this_run", st.completed - p.start_step},
                   {"epochs", p.steps_per_epoch > 0 ? static_cast<double>(st.completed) /
                                                          static_cast<double>(p.steps_per_epoch)
                                                    : 0.0},
                   {"samples", st.samples},
                   {"wall_seconds", wall},
                   {"train_seconds", train_seconds},
                   {"samples_per_second", static_cast<double>(st.samples) / train_seconds},
                   {"output_dir", p.output_dir}};
  s.update(st.last_eval);
  s.update(st.shard_summary);
  if (!st.last_checkpoint.empty()) s["checkpoint"] = st.last_checkpoint;
  write_metrics(self, {{"type", "summary"}, {"summary", s}});
  st.finished = true;
  st.done.deliver(s.dump());
  self->quit();
}

void at_boundary(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  auto t0 = clock_type::now();
  auto resume = [self, t0] {
    auto& st = self->state;
    st.boundary_seconds += seconds_since(t0);
    st.window_start = clock_type::now();
    if (st.completed >= st.plan->total_steps) {
      finish(self);
      return;
    }
    st.boundary = next_boundary(*st.plan, st.completed);
    pump(self);
  };
  bool last = st.completed == p.total_steps;
  bool ckpt = (p.config.checkpoint.every_steps > 0 &&
               st.completed % p.config.checkpoint.every_steps == 0) ||
              (last && p.config.checkpoint.save_at_end);
  int64_t every_check = p.config.strategy.check_replicas_every;
  bool check = strategy_of(self).replicas_must_agree() && st.replicas.size() > 1 &&
               every_check >= 0 && ((every_check > 0 && st.completed % every_check == 0) || last);
  auto after_check = [self, ckpt, resume] {
    if (ckpt)
      save_checkpoint(self, resume);
    else
      resume();
  };
  auto after_epoch = [self, check, after_check] {
    if (check)
      check_replicas(self, after_check);
    else
      after_check();
  };
  bool epoch_end = p.steps_per_epoch > 0 && st.completed % p.steps_per_epoch == 0;
  if (epoch_end || last)
    end_epoch(self, after_epoch);
  else
    after_epoch();
}

void start(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  st.started = st.window_start = clock_type::now();
  st.issued = st.completed = p.start_step;
  if (st.completed >= p.total_steps) {
    spdlog::info("checkpoint is at step {}, the job has {} steps: nothing to train", st.completed,
                 p.total_steps);
    end_epoch(self, [self] { finish(self); });
    return;
  }
  st.boundary = next_boundary(p, st.completed);
  st.driver->start(*st.host);
  pump(self);
}

}  // namespace

coordinator_actor::behavior_type coordinator(self_ptr self, std::shared_ptr<const job_plan> plan,
                                             std::vector<replica_actor> replicas,
                                             std::vector<std::pair<std::string, caf::actor>> others,
                                             shard_set shards) {
  // An exception in the coordinator's own code (a strategy's driver or
  // hooks) fails the job with its message; CAF's default would leave run's
  // promise unanswered for ever.
  self->set_exception_handler([self](std::exception_ptr& x) {
    auto err = exception_exit_reason("coordinator", x);
    auto& st = self->state;
    if (!st.finished) {
      st.finished = true;
      if (st.done.pending()) st.done.deliver(err);
    }
    return err;
  });
  auto& st = self->state;
  st.track = trace::track("coordinator");
  st.plan = std::move(plan);
  st.replicas = std::move(replicas);
  st.others = std::move(others);
  st.shards = std::move(shards);
  st.host = std::make_unique<coordinator_host_impl>(self);
  st.driver = st.plan->strat->make_driver(*st.plan);
  for (std::size_t i = 0; i < st.shards.actors.size(); ++i)
    st.others.emplace_back("variable_shard " + std::to_string(i),
                           caf::actor_cast<caf::actor>(st.shards.actors[i]));
  for (auto& r : st.replicas) self->monitor(r);
  for (auto& [_, a] : st.others) self->monitor(a);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.finished) return;
    std::string who = "an actor";
    std::string cause = dm.reason ? describe(dm.reason) : "exited";
    for (std::size_t i = 0; i < st.replicas.size(); ++i)
      if (dm.source == st.replicas[i].address()) {
        if (st.driver->replica_lost(*st.host, i, cause)) return;
        who = "replica " + std::to_string(i) + " (" +
              st.plan->config.devices[i % st.plan->config.devices.size()] + ")";
        if (i < st.plan->replica_tasks.size())
          who = "task " + st.plan->replica_tasks[i] + " (" + who + ")";
      }
    for (auto& [name, a] : st.others)
      if (dm.source == a.address()) who = name;
    fail(self, who + " stopped: " + cause);
  });
  st.metrics.open(std::filesystem::path(st.plan->output_dir) / "metrics.jsonl",
                  st.plan->start_step > 0 ? std::ios::app : std::ios::trunc);
  return {
      [self](run_atom) -> caf::result<std::string> {
        auto& st = self->state;
        st.done = self->make_response_promise<std::string>();
        const auto& p = *st.plan;
        if (!p.resume_from) {
          start(self);
          return st.done;
        }
        auto ms = std::make_shared<const model_state>(
            model_state{p.resume_from->variables, p.resume_from->slots});
        strategy_of(self).restore(*st.host, std::move(ms), [self] { start(self); });
        return st.done;
      },
      [self](rejoin_atom, int64_t index, replica_actor& r) {
        auto& st = self->state;
        if (st.finished || index < 0 || static_cast<std::size_t>(index) >= st.replicas.size() || !r)
          return;
        st.driver->rejoin(*st.host, static_cast<std::size_t>(index), std::move(r));
      },
  };
}

}  // namespace troupe
