#include "actors/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

namespace troupe {
namespace {

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;
using clock_type = std::chrono::steady_clock;

// Steps kept in flight per replica, so a replica never idles between steps.
constexpr int64_t pipeline_depth = 2;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
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
  st.done.deliver(caf::make_error(caf::sec::runtime_error, why));
  self->quit(caf::make_error(caf::sec::runtime_error, why));
}

// Error handler for a request to a monitored actor. When the actor died, its
// down_msg carries the cause and names it, so that is what gets reported.
auto failed(self_ptr self, std::string what) {
  return [self, what = std::move(what)](caf::error& e) {
    if (e == caf::sec::request_receiver_down) return;
    fail(self, what + ": " + describe(e));
  };
}

int64_t next_boundary(const job_plan& p, int64_t completed) {
  int64_t b = p.total_steps;
  b = std::min(b, (completed / p.steps_per_epoch + 1) * p.steps_per_epoch);
  for (int64_t e : {p.config.checkpoint.every_steps, p.config.strategy.check_replicas_every})
    if (e > 0) b = std::min(b, (completed / e + 1) * e);
  return b;
}

void pump(self_ptr self);
void at_boundary(self_ptr self);

// Merges the per-replica results of one synchronous step.
struct step_join {
  int64_t pending = 0;
  step_stats sum;
};

void issue(self_ptr self, int64_t step) {
  auto& st = self->state;
  auto join = std::make_shared<step_join>();
  join->pending = static_cast<int64_t>(st.replicas.size());
  for (auto& r : st.replicas) {
    self->request(r, caf::infinite, train_atom::value, step)
        .then(
            [self, join](step_stats& s) {
              join->sum.step = s.step;
              join->sum.epoch = s.epoch;
              join->sum.lr = s.lr;
              join->sum.loss_sum += s.loss_sum;
              join->sum.correct += s.correct;
              join->sum.count += s.count;
              if (--join->pending > 0) return;
              auto& st = self->state;
              if (st.finished) return;
              ++st.completed;
              st.samples += join->sum.count;
              st.window_loss += join->sum.loss_sum;
              st.window_count += join->sum.count;
              const auto& p = *st.plan;
              if (st.completed % p.config.logging.every_steps == 0 || st.completed == st.boundary) {
                double win = seconds_since(st.window_start);
                progress_info pi;
                pi.step = st.completed;
                pi.total_steps = p.total_steps;
                pi.epoch = join->sum.epoch;
                pi.epochs = p.config.training.epochs;
                pi.loss =
                    st.window_count ? st.window_loss / static_cast<double>(st.window_count) : 0;
                pi.samples_per_second = win > 0 ? static_cast<double>(st.window_count) / win : 0;
                pi.elapsed_seconds = seconds_since(st.started);
                write_metrics(self, {{"type", "step"},
                                     {"step", pi.step},
                                     {"epoch", pi.epoch},
                                     {"loss", pi.loss},
                                     {"lr", join->sum.lr},
                                     {"samples_per_second", pi.samples_per_second},
                                     {"elapsed_seconds", pi.elapsed_seconds}});
                if (p.options.on_progress) p.options.on_progress(pi);
                st.window_loss = 0;
                st.window_count = 0;
                st.window_start = clock_type::now();
              }
              if (st.completed == st.boundary)
                at_boundary(self);
              else
                pump(self);
            },
            failed(self, "training step failed"));
  }
}

void pump(self_ptr self) {
  auto& st = self->state;
  if (st.finished) return;
  while (st.issued < st.boundary && st.issued - st.completed < pipeline_depth)
    issue(self, st.issued++);
}

// Reads the replicas' sync-on-read training metrics (resetting them), then
// evaluates on the test set when due, then calls k.
void end_epoch(self_ptr self, std::function<void()> k) {
  auto& st = self->state;
  const auto& p = *st.plan;
  int64_t epoch = (st.completed - 1) / p.steps_per_epoch;
  auto sums = std::make_shared<std::pair<metric_sums, int64_t>>(metric_sums{}, st.replicas.size());
  for (auto& r : st.replicas) {
    self->request(r, caf::infinite, metrics_atom::value, true)
        .then(
            [self, sums, epoch, k](metric_sums& m) {
              sums->first.loss_sum += m.loss_sum;
              sums->first.correct += m.correct;
              sums->first.count += m.count;
              if (--sums->second > 0) return;
              auto& st = self->state;
              const auto& p = *st.plan;
              nlohmann::json line{{"type", "epoch"}, {"epoch", epoch}, {"step", st.completed}};
              const auto& tm = sums->first;
              if (tm.count > 0) {
                line["train_loss"] = tm.loss_sum / static_cast<double>(tm.count);
                line["train_accuracy"] =
                    static_cast<double>(tm.correct) / static_cast<double>(tm.count);
              }
              int64_t every = p.config.training.eval_every_epochs;
              bool last = st.completed == p.total_steps;
              bool due = last || (every > 0 && (epoch + 1) % every == 0);
              if (!due || !p.test || p.test->size() == 0) {
                write_metrics(self, line);
                if (p.options.on_epoch) p.options.on_epoch(line);
                k();
                return;
              }
              self->request(st.replicas.front(), caf::infinite, eval_atom::value, p.test->images,
                            p.test->labels)
                  .then(
                      [self, line, k](metric_sums& e) mutable {
                        auto& st = self->state;
                        double n = static_cast<double>(std::max<int64_t>(1, e.count));
                        st.last_eval = {{"test_loss", e.loss_sum / n},
                                        {"test_accuracy", static_cast<double>(e.correct) / n}};
                        st.last_eval_step = st.completed;
                        line.update(st.last_eval);
                        write_metrics(self, line);
                        if (st.plan->options.on_epoch) st.plan->options.on_epoch(line);
                        k();
                      },
                      failed(self, "evaluation failed"));
            },
            failed(self, "reading metrics failed"));
  }
}

// Asks every replica for its state at once and hands all states to k.
void collect_states(self_ptr self, std::function<void(std::vector<model_state>&)> k) {
  auto& st = self->state;
  auto n = st.replicas.size();
  auto states = std::make_shared<std::vector<model_state>>(n);
  auto left = std::make_shared<std::size_t>(n);
  for (std::size_t i = 0; i < n; ++i)
    self->request(st.replicas[i], caf::infinite, state_atom::value)
        .then(
            [states, left, i, k](model_state& ms) {
              (*states)[i] = std::move(ms);
              if (--*left == 0) k(*states);
            },
            failed(self, "reading replica state failed"));
}

void save_checkpoint(self_ptr self, std::function<void()> k) {
  auto save = [self, k](model_state& ms) {
    auto& st = self->state;
    const auto& p = *st.plan;
    checkpoint::snapshot snap;
    snap.meta.job = p.config.name;
    snap.meta.strategy = p.config.strategy.kind;
    snap.meta.step = st.completed;
    snap.meta.epoch = st.completed / p.steps_per_epoch;
    snap.meta.batch_in_epoch = st.completed % p.steps_per_epoch;
    snap.meta.config = to_json(p.config);
    snap.variables = std::move(ms.variables);
    snap.slots = std::move(ms.slots);
    try {
      st.last_checkpoint = checkpoint::save(p.checkpoint_dir, snap, p.config.checkpoint.keep);
    } catch (const std::exception& e) {
      fail(self, std::string("writing checkpoint failed: ") + e.what());
      return;
    }
    spdlog::info("checkpoint saved: {} (step {})", st.last_checkpoint, st.completed);
    write_metrics(self,
                  {{"type", "checkpoint"}, {"step", st.completed}, {"path", st.last_checkpoint}});
    k();
  };
  auto& st = self->state;
  // Sharded optimizer slots are gathered by a collective: every replica
  // takes part, and then any of them holds the whole state.
  if (st.plan->config.strategy.kind == "mirrored" && st.plan->config.strategy.shard_optimizer) {
    collect_states(self, [save](std::vector<model_state>& all) mutable { save(all.front()); });
    return;
  }
  self->request(st.replicas.front(), caf::infinite, state_atom::value)
      .then(save, failed(self, "checkpoint snapshot failed"));
}

// Mirrored replicas must hold bit-identical variables: compare them all with
// replica 0, and end the job naming the first variable that differs.
void check_replicas(self_ptr self, std::function<void()> k) {
  collect_states(self, [self, k](std::vector<model_state>& states) {
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
  nlohmann::json s{
      {"job", p.config.name},
      {"strategy", p.config.strategy.kind},
      {"replicas", st.replicas.size()},
      {"steps", st.completed},
      {"steps_this_run", st.completed - p.start_step},
      {"epochs", static_cast<double>(st.completed) / static_cast<double>(p.steps_per_epoch)},
      {"samples", st.samples},
      {"wall_seconds", wall},
      {"train_seconds", train_seconds},
      {"samples_per_second", static_cast<double>(st.samples) / train_seconds},
      {"output_dir", p.output_dir}};
  s.update(st.last_eval);
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
  bool check = st.replicas.size() > 1 && every_check >= 0 &&
               ((every_check > 0 && st.completed % every_check == 0) || last);
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
  if (st.completed % p.steps_per_epoch == 0 || last)
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
  pump(self);
}

}  // namespace

coordinator_actor::behavior_type coordinator(
    self_ptr self, std::shared_ptr<const job_plan> plan, std::vector<replica_actor> replicas,
    std::vector<std::pair<std::string, caf::actor>> others) {
  auto& st = self->state;
  st.plan = std::move(plan);
  st.replicas = std::move(replicas);
  st.others = std::move(others);
  for (auto& r : st.replicas) self->monitor(r);
  for (auto& [_, a] : st.others) self->monitor(a);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.finished) return;
    std::string who = "an actor";
    for (std::size_t i = 0; i < st.replicas.size(); ++i)
      if (dm.source == st.replicas[i].address())
        who = "replica " + std::to_string(i) + " (" +
              st.plan->config.devices[i % st.plan->config.devices.size()] + ")";
    for (auto& [name, a] : st.others)
      if (dm.source == a.address()) who = name;
    std::string cause = dm.reason ? describe(dm.reason) : "exited";
    fail(self, who + " stopped: " + cause);
  });
  st.metrics.open(std::filesystem::path(st.plan->output_dir) / "metrics.jsonl",
                  st.plan->start_step > 0 ? std::ios::app : std::ios::trunc);
  return {
      [self](run_atom) -> caf::result<std::string> {
        auto& st = self->state;
        st.done = self->make_response_promise<std::string>();
        const auto& p = *st.plan;
        if (p.resume_from) {
          auto ms = std::make_shared<model_state>(
              model_state{p.resume_from->variables, p.resume_from->slots});
          auto left = std::make_shared<std::size_t>(st.replicas.size());
          for (auto& r : st.replicas)
            self->request(r, caf::infinite, restore_atom::value, *ms)
                .then(
                    [self, left](int64_t) {
                      if (--*left == 0) start(self);
                    },
                    failed(self, "restoring the checkpoint failed"));
        } else {
          start(self);
        }
        return st.done;
      },
  };
}

}  // namespace troupe
