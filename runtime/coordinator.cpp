#include "runtime/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "actors/failure.hpp"
#include "actors/worker_parts.hpp"
#include "monitoring/jsonl_sink.hpp"
#include "runtime/checkpointing.hpp"
#include "runtime/local_send.hpp"
#include "runtime/preemption.hpp"
#include "runtime/stop_policy.hpp"

namespace troupe {
namespace {

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;
using clock_type = std::chrono::steady_clock;
using phase = coordinator_state::phase;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

void write_metrics(self_ptr self, const nlohmann::json& j) {
  trace::scoped_span span(self->state.track, "write_metrics", trace::category::io);
  self->state.metrics.write(j, self->state.completed);
}

void fail(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.finished()) return;
  st.now = phase::finished;
  spdlog::error("job failed: {}", why);
  if (st.done.pending()) st.done.deliver(caf::make_error(caf::sec::runtime_error, why));
  self->quit(caf::make_error(caf::sec::runtime_error, why));
}

// The update after which the job has no more to train (0 total steps: the
// strategy's stop criterion ends it).
int64_t end_step(const job_plan& p) {
  return p.total_steps > 0 ? p.total_steps : std::numeric_limits<int64_t>::max();
}

// The next update at which the job stops issuing and does boundary work:
// the end of an epoch (strategies with epochs), a checkpoint, a replica check.
int64_t next_boundary(const job_plan& p, int64_t completed) {
  int64_t b = end_step(p);
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
void drained_check(self_ptr self);
void last_boundary(self_ptr self);
void steps_given_up(self_ptr self);
void check_stop(self_ptr self);

}  // namespace

class coordinator_host_impl final : public coordinator_host {
 public:
  explicit coordinator_host_impl(self_ptr self) : self_(self) {}
  coordinator_actor::pointer self() override { return self_; }
  const job_plan& plan() const override { return *self_->state.plan; }
  std::vector<replica_actor>& replicas() override { return self_->state.parts->replicas; }
  const std::vector<replica_actor>& replicas() const override {
    return self_->state.parts->replicas;
  }
  const shard_set& shards() const override { return self_->state.parts->shards; }
  int64_t& issued() override { return self_->state.issued; }
  int64_t completed() const override { return self_->state.completed; }
  int64_t boundary() const override { return self_->state.boundary; }
  bool finished() const override { return self_->state.finished(); }
  void step_done(const step_stats& s) override { troupe::step_done(self_, s); }
  void steps_given_up() override { troupe::steps_given_up(self_); }
  void write_metrics(const nlohmann::json& line) override { troupe::write_metrics(self_, line); }
  void fail(const std::string& why) override { troupe::fail(self_, why); }
  std::vector<replica_actor> live_replicas() const override {
    return self_->state.driver->live(*this);
  }
  nlohmann::json& summary_extras() override { return self_->state.summary_extras; }
  double elapsed_seconds() const override { return seconds_since(self_->state.started); }

 private:
  self_ptr self_;
};

coordinator_state::coordinator_state() = default;
coordinator_state::~coordinator_state() = default;

namespace {

const strategy& strategy_of(self_ptr self) {
  return *self->state.plan->strat;
}

// Every logging.every_steps updates: a metrics line and a progress report,
// with the strategy's progress measure added.
void report_progress(self_ptr self, const step_stats& last) {
  auto& st = self->state;
  const auto& p = *st.plan;
  const double win = seconds_since(st.window_start);
  progress_info pi;
  pi.unit = st.driver->unit();
  pi.step = st.completed;
  pi.total_steps = p.total_steps;
  pi.loss = st.window_count ? st.window_loss / static_cast<double>(st.window_count) : 0;
  pi.samples_per_second = win > 0 ? static_cast<double>(st.window_count) / win : 0;
  pi.elapsed_seconds = seconds_since(st.started);
  nlohmann::json line{{"type", st.driver->progress_line_type()}, {"step", pi.step}};
  if (p.steps_per_epoch > 0) {
    const int64_t epoch = epoch_of(p, st.completed);
    line["epoch"] = epoch;
    pi.figures["epoch"] = epoch;
    pi.measure =
        "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(p.config.training.epochs);
  }
  line["loss"] = pi.loss;
  if (p.train) line["lr"] = strategy_of(self).reported_lr(p, st.completed, last);
  line["samples_per_second"] = pi.samples_per_second;
  line["elapsed_seconds"] = pi.elapsed_seconds;
  st.driver->progress(*st.host, line, pi);
  write_metrics(self, line);
  if (p.options.on_progress) p.options.on_progress(pi);
  st.window_loss = 0;
  st.window_count = 0;
  st.window_start = clock_type::now();
}

// Books a finished update (all replicas' parts of a lockstep step, one
// worker's push, or a learner's update): progress, metrics lines, and the
// next steps, a boundary or the stop.
void step_done(self_ptr self, const step_stats& sum) {
  auto& st = self->state;
  if (st.finished()) return;
  ++st.completed;
  st.samples += sum.count;
  if (st.first_step_seconds < 0) st.first_step_seconds = seconds_since(st.started);
  stop_policy::publish_step(st.completed);
  // A diverged job stops at once, saying so, instead of training on NaN to
  // the end (and leaving NaN checkpoints and metrics behind).
  if (!std::isfinite(sum.loss_sum))
    return fail(self, "training diverged: the loss is " + std::to_string(sum.loss_sum) +
                          " at step " + std::to_string(st.completed) +
                          " (a lower optimizer.learning_rate, or a gradient clip, may help)");
  st.window_loss += sum.loss_sum;
  st.window_count += sum.count;
  const auto& p = *st.plan;
  if (st.completed % p.config.logging.every_steps == 0 || st.completed == st.boundary)
    report_progress(self, sum);
  // Updates that finish while the job stops still count, nothing more.
  if (st.now == phase::stopping) return drained_check(self);
  const auto& shard_fault = faults_or_none(p.options.faults).fail_shard;
  const auto& shards = st.parts->shards.actors;
  if (shard_fault.index >= 0 && shard_fault.index < static_cast<int64_t>(shards.size()) &&
      st.completed == shard_fault.at)
    self->send_exit(shards[static_cast<std::size_t>(shard_fault.index)],
                    caf::make_error(caf::sec::runtime_error, "injected failure"));
  check_stop(self);
  if (st.now != phase::running) return;
  if (st.completed == st.boundary)
    at_boundary(self);
  else
    pump(self);
}

void steps_given_up(self_ptr self) {
  auto& st = self->state;
  if (st.now == phase::stopping) return drained_check(self);
  if (st.now != phase::running) return;
  if (st.issued == st.completed && st.completed == st.boundary)
    at_boundary(self);
  else
    pump(self);
}

void pump(self_ptr self) {
  auto& st = self->state;
  if (st.now != phase::running) return;
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
        // train_seconds leaves out the evaluations and checkpoints before it,
        // as time-to-accuracy comparisons count it.
        const std::chrono::duration<double> trained = st.boundary_started - st.started;
        nlohmann::json line{{"type", "epoch"},
                            {"epoch", epoch},
                            {"step", st.completed},
                            {"elapsed_seconds", seconds_since(st.started)},
                            {"train_seconds", trained.count() - st.boundary_seconds}};
        if (tm.count > 0) {
          line["train_loss"] = tm.loss_sum / static_cast<double>(tm.count);
          line["train_accuracy"] = static_cast<double>(tm.correct) / static_cast<double>(tm.count);
        }
        int64_t every = p.config.training.eval_every_epochs;
        bool last = st.completed >= end_step(p);
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
  std::function<void(model_state&)> write = [self, k](model_state& ms) {
    auto& st = self->state;
    if (st.finished()) return;
    const int64_t step = st.driver->checkpoint_step(ms, st.completed);
    trace::scoped_span span(st.track, "checkpoint_write", trace::category::io, {step, -1, -1});
    stop_policy::hold_for_test("checkpoint");
    auto path = write_checkpoint(*st.host, step, ms, st.driver->checkpoint_extra());
    if (!path) return;  // the host failed the job
    stop_policy::publish_checkpoint(*path);
    st.last_checkpoint = *path;
    st.last_checkpoint_step = st.completed;
    k();
  };
  auto& st = self->state;
  if (!st.driver->snapshot(*st.host, write)) strategy_of(self).snapshot(*st.host, write);
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
  if (st.finished()) return;
  const auto& p = *st.plan;
  double wall = seconds_since(st.started);
  double train_seconds = std::max(1e-9, wall - st.boundary_seconds);
  nlohmann::json s{{"job", p.config.name},
                   {"strategy", p.config.strategy.kind},
                   {"steps", st.completed},
                   {"steps_this_run", st.completed - p.start_step},
                   {"samples", st.samples},
                   {"wall_seconds", wall},
                   {"train_seconds", train_seconds},
                   {"samples_per_second", static_cast<double>(st.samples) / train_seconds},
                   {"output_dir", p.output_dir}};
  if (!st.parts->replicas.empty()) s["replicas"] = st.parts->replicas.size();
  if (p.steps_per_epoch > 0)
    s["epochs"] = static_cast<double>(st.completed) / static_cast<double>(p.steps_per_epoch);
  if (st.first_step_seconds >= 0) s["first_step_seconds"] = st.first_step_seconds;
  if (!st.stop_reason.empty()) s["stop_reason"] = st.stop_reason;
  s.update(st.last_eval);
  s.update(st.summary_extras);
  st.driver->summarize(s);
  if (!st.last_checkpoint.empty()) s["checkpoint"] = st.last_checkpoint;
  if (!st.preempted.empty()) s["preempted"] = st.preempted;
  mark_preemption(p, s);
  stop_policy::publish_job(s);
  write_metrics(self, {{"type", "summary"}, {"summary", s}});
  st.now = phase::finished;
  st.done.deliver(s.dump());
  self->quit();
}

// The boundary's work in order: the epoch's metrics and evaluation, the
// replica check, the checkpoint; then k.
void boundary_work(self_ptr self, bool epoch_end, bool check, bool ckpt, std::function<void()> k) {
  auto after_check = [self, ckpt, k] {
    if (ckpt)
      save_checkpoint(self, k);
    else
      k();
  };
  auto after_epoch = [self, check, after_check] {
    if (check)
      check_replicas(self, after_check);
    else
      after_check();
  };
  if (epoch_end)
    end_epoch(self, after_epoch);
  else
    after_epoch();
}

bool replicas_checked(self_ptr self) {
  const auto& st = self->state;
  return strategy_of(self).replicas_must_agree() && st.parts->replicas.size() > 1 &&
         st.plan->config.strategy.check_replicas_every >= 0;
}

// The end of the job, for any reason: the strategy halts its own actors,
// then the last boundary (epoch, check, checkpoint at the end), then the
// summary.
void stop(self_ptr self, std::string reason) {
  auto& st = self->state;
  if (st.now == phase::stopping || st.finished()) return;
  st.now = phase::stopping;
  st.stop_reason = std::move(reason);
  if (!st.stop_reason.empty()) spdlog::info("stopping: {}", st.stop_reason);
  st.driver->halt(*st.host, [self](int64_t updates) {
    auto& st = self->state;
    if (st.finished()) return;
    if (updates >= 0) st.completed = updates;
    st.when_drained = [self] { last_boundary(self); };
    drained_check(self);
  });
}

// The stopped job's last boundary, once its steps in flight are in: a
// preempted job has seconds to leave, so only its checkpoint (unless the last
// boundary just wrote this step's), no evaluation, no replica check. A job
// that ended its training enters the phases in which a signal stops it at
// once (runtime/stop_policy.hpp): its evaluation, then writing its results.
void last_boundary(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  const auto t0 = st.boundary_started = clock_type::now();
  const bool preempted = !st.preempted.empty();
  const bool ckpt = preempted ? st.last_checkpoint_step != st.completed
                              : p.config.checkpoint.save_at_end ||
                                    (p.config.checkpoint.every_steps > 0 &&
                                     st.completed % p.config.checkpoint.every_steps == 0);
  auto done = [self, t0] {
    self->state.boundary_seconds += seconds_since(t0);
    finish(self);
  };
  if (preempted) return boundary_work(self, false, false, ckpt, done);
  // A job over a dataset ends with its epoch line and evaluation, epochs or not.
  const bool epoch_end = p.train != nullptr;
  stop_policy::enter(epoch_end ? stop_policy::phase::evaluating : stop_policy::phase::writing);
  boundary_work(self, epoch_end, replicas_checked(self), false, [self, ckpt, done] {
    stop_policy::enter(stop_policy::phase::writing);
    boundary_work(self, false, false, ckpt, done);
  });
}

// A stop can come with steps in flight (a preemption, a stop criterion met
// mid-pipeline): the replicas answer a snapshot between a step's all-reduce
// and its update, so the last boundary starts when every issued step is in.
void drained_check(self_ptr self) {
  auto& st = self->state;
  if (!st.when_drained || st.issued > st.completed) return;
  auto k = std::exchange(st.when_drained, {});
  k();
}

// After every update and report: the strategy's stop criterion.
void check_stop(self_ptr self) {
  auto& st = self->state;
  if (st.now != phase::running && st.now != phase::at_boundary) return;
  if (!st.preempted.empty()) return stop(self, "preempted by " + st.preempted);
  auto why = st.driver->stop_reason(*st.host);
  if (!why.empty()) stop(self, std::move(why));
}

void at_boundary(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  if (st.completed >= end_step(p)) return stop(self, {});
  st.now = phase::at_boundary;
  const auto t0 = st.boundary_started = clock_type::now();
  auto resume = [self, t0] {
    auto& st = self->state;
    if (st.now != phase::at_boundary) return;  // the job stops or failed meanwhile
    st.boundary_seconds += seconds_since(t0);
    st.window_start = clock_type::now();
    st.boundary = next_boundary(*st.plan, st.completed);
    st.now = phase::running;
    check_stop(self);
    pump(self);
  };
  const bool ckpt =
      p.config.checkpoint.every_steps > 0 && st.completed % p.config.checkpoint.every_steps == 0;
  const int64_t every_check = p.config.strategy.check_replicas_every;
  const bool check = replicas_checked(self) && every_check > 0 && st.completed % every_check == 0;
  const bool epoch_end = p.steps_per_epoch > 0 && st.completed % p.steps_per_epoch == 0;
  boundary_work(self, epoch_end, check, ckpt, resume);
}

void start(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  st.started = st.window_start = st.boundary_started = clock_type::now();
  st.issued = st.completed = p.start_step;
  if (st.completed >= end_step(p)) {
    spdlog::info("checkpoint is at step {}, the job has {} steps: nothing to train", st.completed,
                 p.total_steps);
    st.now = phase::stopping;
    stop_policy::enter(stop_policy::phase::evaluating);
    if (p.train)
      end_epoch(self, [self] { finish(self); });
    else
      finish(self);
    return;
  }
  st.boundary = next_boundary(p, st.completed);
  st.now = phase::running;
  st.driver->start(*st.host);
  check_stop(self);  // a preemption that came while restoring
  pump(self);
}

// From here a signal stops the job at the next update with a checkpoint;
// a stop that cannot wait for that still finds what to write in its summary.
void start_training(self_ptr self) {
  const auto& p = *self->state.plan;
  stop_policy::publish_step(p.start_step);
  stop_policy::publish_job({{"job", p.config.name},
                            {"strategy", p.config.strategy.kind},
                            {"steps", p.start_step},
                            {"output_dir", p.output_dir}});
  stop_policy::enter(stop_policy::phase::training);
}

void restore_then_start(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  st.now = phase::restoring;
  std::function<void()> k = [self] { start(self); };
  if (st.driver->restore(*st.host, k)) return;
  auto ms = std::make_shared<const model_state>(
      model_state{p.resume_from->variables, p.resume_from->slots, p.resume_from->state});
  strategy_of(self).restore(*st.host, std::move(ms), k);
}

// The process is asked to leave: the job stops at the next update (at once
// when running; after the boundary's work when at one; after the restore
// when restoring), with a checkpoint. A job already stopping ends as it was.
void on_preempt(self_ptr self, std::string signal) {
  auto& st = self->state;
  if (st.finished() || st.now == phase::stopping || !st.preempted.empty()) return;
  st.preempted = std::move(signal);
  spdlog::warn("{}: the job stops at the next update with a checkpoint (step {} of {})",
               st.preempted, st.completed, st.plan->total_steps);
  if (st.now == phase::running) check_stop(self);
}

// Whether the control message now handled came from this process (its
// signal watch, run_coordinator, the chief's node actor): the job's lifecycle
// is never a peer's to drive (runtime/local_send.hpp). Refusals are logged.
bool from_here(self_ptr self, const char* what) {
  if (sent_from_here(self)) return true;
  spdlog::warn("coordinator: refused '{}' from {}: only this process may send it", what,
               sender_text(self));
  return false;
}

std::string replica_name(const coordinator_state& st, std::size_t i) {
  std::string who = "replica " + std::to_string(i) + " (" +
                    st.plan->config.devices[i % st.plan->config.devices.size()] + ")";
  if (i < st.plan->replica_tasks.size())
    who = "task " + st.plan->replica_tasks[i] + " (" + who + ")";
  return who;
}

// Who a down message names, for the failure: a replica (and its task), a
// watched actor, or the driver's own worker that it lets go.
void on_down(self_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.finished()) return;
  const std::string cause = dm.reason ? describe(dm.reason) : "exited";
  const auto& replicas = st.parts->replicas;
  for (std::size_t i = 0; i < replicas.size(); ++i)
    if (dm.source == replicas[i].address()) {
      std::optional<std::string> failure;
      if (!st.driver->replica_lost(*st.host, i, cause))
        failure = replica_name(st, i) + " stopped: " + cause;
      if (auto now = st.failures.replica_down(i, cause, std::move(failure))) fail(self, *now);
      return;
    }
  std::string who = "an actor";
  for (auto& [name, a] : st.parts->others)
    if (dm.source == a.address()) who = name;
  if (who == "an actor" && st.driver->actor_lost(*st.host, dm.source, cause)) return;
  fail(self, who + " stopped: " + cause);
}

void watch_parts(self_ptr self) {
  auto& st = self->state;
  auto& parts = *st.parts;
  for (std::size_t i = 0; i < parts.shards.actors.size(); ++i)
    parts.others.emplace_back("variable_shard " + std::to_string(i),
                              caf::actor_cast<caf::actor>(parts.shards.actors[i]));
  if (parts.hub)
    for (auto& named : parts.hub->named()) parts.others.push_back(std::move(named));
  st.failures = failure_order(parts.replicas.size());
  for (auto& r : parts.replicas) self->monitor(r);
  for (auto& [_, a] : parts.others) self->monitor(a);
  for (auto& [_, w] : parts.workers)
    if (w) self->monitor(w);
}

}  // namespace

coordinator_actor::behavior_type coordinator(self_ptr self, std::shared_ptr<const job_plan> plan,
                                             std::shared_ptr<job_parts> parts) {
  // An exception in the coordinator's own code (a strategy's driver or
  // hooks) fails the job with its message; CAF's default would leave run's
  // promise unanswered for ever.
  self->set_exception_handler([self](std::exception_ptr& x) {
    auto err = exception_exit_reason("coordinator", x);
    auto& st = self->state;
    if (!st.finished()) {
      st.now = phase::finished;
      if (st.done.pending()) st.done.deliver(err);
    }
    return err;
  });
  auto& st = self->state;
  st.track = trace::track("coordinator");
  st.plan = std::move(plan);
  st.parts = std::move(parts);
  st.host = std::make_unique<coordinator_host_impl>(self);
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  st.metrics.add(std::make_shared<monitoring::jsonl_sink>(
      (std::filesystem::path(st.plan->output_dir) / "metrics.jsonl").string(),
      st.plan->resume_from.has_value()));
  st.metrics.add(st.plan->metrics_sink);
  return {
      [self](run_atom) -> caf::result<std::string> {
        if (!from_here(self, "run"))
          return caf::make_error(caf::sec::runtime_error, "coordinator: 'run' refused");
        auto& st = self->state;
        st.done = self->make_response_promise<std::string>();
        if (st.now != phase::waiting) {
          st.done.deliver(caf::make_error(caf::sec::runtime_error, "the job runs already"));
          return st.done;
        }
        auto& parts = *st.parts;
        st.driver = parts.hub ? parts.hub->make_driver(parts.workers)
                              : strategy_of(self).make_driver(*st.plan);
        watch_parts(self);
        start_training(self);
        if (st.plan->resume_from)
          restore_then_start(self);
        else
          start(self);
        return st.done;
      },
      [self](preempt_atom, std::string& signal) {
        if (from_here(self, "preempt")) on_preempt(self, std::move(signal));
      },
      [self](rejoin_atom, int64_t index, caf::actor& a) {
        auto& st = self->state;
        if (!from_here(self, "rejoin")) return;
        if (st.finished() || st.now == phase::stopping || !st.driver || index < 0 || !a) return;
        st.driver->rejoin(*st.host, static_cast<std::size_t>(index), std::move(a));
      },
      [self](episodes_atom, episode_report& r) {
        auto& st = self->state;
        if (st.now != phase::running && st.now != phase::at_boundary) return;
        st.driver->on_episodes(*st.host, r);
        check_stop(self);
      },
      [self](learned_atom, learner_report& r) {
        auto& st = self->state;
        if (st.finished() || !st.driver) return;
        st.driver->on_learned(*st.host, r);
      },
      [self](weights_atom, policy_weights& w) {
        auto& st = self->state;
        if (st.finished() || !st.driver) return;
        st.driver->on_weights(*st.host, w);
      },
  };
}

void hand_over(job_parts& parts, const worker_parts& workers, shard_set shards,
               std::shared_ptr<job_hub> hub) {
  parts.replicas = workers.replicas;
  parts.shards = std::move(shards);
  parts.others = workers.named();
  for (std::size_t k = 0; k < workers.others.size() && k < workers.indices.size(); ++k)
    parts.workers.emplace_back(workers.indices[k], workers.others[k]);
  parts.hub = std::move(hub);
}

nlohmann::json run_coordinator(caf::actor_system& sys, const coordinator_actor& coordinator) {
  std::string error;
  nlohmann::json summary;
  caf::scoped_actor self{sys};
  // SIGINT/SIGTERM/SIGUSR1 (runtime/stop_policy.hpp) reach the job as a message.
  preemption::watch preempt([&sys, coordinator](int signal) {
    send_from_here(sys, coordinator, preempt_atom::value, preemption::signal_name(signal));
  });
  self->request(coordinator, caf::infinite, run_atom::value)
      .receive([&](std::string& s) { summary = nlohmann::json::parse(s); },
               [&](caf::error& e) { error = describe(e); });
  if (!error.empty()) throw job_error(error);
  return summary;
}

}  // namespace troupe
