#include "actors/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "kernels/lr_schedule.hpp"

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

bool async_workers(const coordinator_state& st) {
  const auto& k = st.plan->config.strategy.kind;
  return k == "parameter_server" || k == "elastic_average";
}

bool elastic(const coordinator_state& st) {
  return st.plan->config.strategy.kind == "elastic_average";
}

// Synchronous EASGD: the center shards wait for one push per admitted, live
// worker per round; tell them how many that is now.
void update_contributors(self_ptr self) {
  auto& st = self->state;
  if (!elastic(st) || !st.plan->config.strategy.synchronous) return;
  int64_t k = 0;
  for (const auto& w : st.workers) k += w.alive && w.admitted ? 1 : 0;
  for (auto& s : st.shards.actors)
    self->request(s, self->state.plan->request_timeout, aggregate_atom::value, k)
        .then([](int64_t) {}, failed(self, "telling the shards the workers failed"));
}

// Books a finished update (all replicas' parts of a synchronous step, or one
// worker's push): progress, metrics lines, and the next steps or a boundary.
void step_done(self_ptr self, const step_stats& sum) {
  auto& st = self->state;
  if (st.finished) return;
  ++st.completed;
  st.samples += sum.count;
  st.window_loss += sum.loss_sum;
  st.window_count += sum.count;
  const auto& p = *st.plan;
  if (st.completed % p.config.logging.every_steps == 0 || st.completed == st.boundary) {
    double win = seconds_since(st.window_start);
    progress_info pi;
    pi.step = st.completed;
    pi.total_steps = p.total_steps;
    pi.epoch = (st.completed - 1) / p.steps_per_epoch;
    pi.epochs = p.config.training.epochs;
    pi.loss = st.window_count ? st.window_loss / static_cast<double>(st.window_count) : 0;
    pi.samples_per_second = win > 0 ? static_cast<double>(st.window_count) / win : 0;
    pi.elapsed_seconds = seconds_since(st.started);
    // With shards the replicas' own optimizers never step: the schedule says.
    double lr = st.shards.actors.empty() ? sum.lr
                                         : kernels::learning_rate_at(
                                               p.config.optimizer, st.completed - 1, p.total_steps);
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

void issue(self_ptr self, int64_t step) {
  auto& st = self->state;
  auto join = std::make_shared<step_join>();
  join->pending = static_cast<int64_t>(st.replicas.size());
  for (auto& r : st.replicas) {
    self->request(r, self->state.plan->request_timeout, train_atom::value, step)
        .then(
            [self, join](step_stats& s) {
              join->sum.step = s.step;
              join->sum.epoch = s.epoch;
              join->sum.lr = s.lr;
              join->sum.loss_sum += s.loss_sum;
              join->sum.correct += s.correct;
              join->sum.count += s.count;
              if (--join->pending == 0) step_done(self, join->sum);
            },
            failed(self, "training step failed"));
  }
}

// --- parameter_server: workers step independently ---

// The slowest admitted, live worker's clock (-1: none).
int64_t slowest_clock(const coordinator_state& st) {
  int64_t m = -1;
  for (const auto& w : st.workers)
    if (w.alive && w.admitted && (m < 0 || w.clock < m)) m = w.clock;
  return m;
}

// Admits workers whose time has come: a joining worker starts level with the
// slowest one, so the staleness bound does not stall the others.
void admit_workers(self_ptr self) {
  auto& st = self->state;
  bool joined = false;
  for (std::size_t i = 0; i < st.workers.size(); ++i) {
    auto& w = st.workers[i];
    if (!w.alive || w.admitted || st.completed < w.admit_at) continue;
    w.admitted = true;
    w.clock = std::max<int64_t>(0, slowest_clock(st));
    if (w.admit_at > 0) {
      joined = true;
      spdlog::info("worker {} joins at update {} (worker step {})", i, st.completed, w.clock);
      write_metrics(self, {{"type", "worker_joined"}, {"worker", i}, {"step", st.completed}});
    }
  }
  if (joined) update_contributors(self);
}

void issue_to_worker(self_ptr self, std::size_t i) {
  auto& st = self->state;
  auto& w = st.workers[i];
  w.busy = true;
  ++st.issued;
  self->request(st.replicas[i], self->state.plan->request_timeout, train_atom::value, w.clock)
      .then(
          [self, i](step_stats& s) {
            auto& st = self->state;
            auto& w = st.workers[i];
            w.busy = false;
            ++w.clock;
            write_metrics(self, {{"type", "push"}, {"worker", i}, {"worker_step", s.step}});
            step_done(self, s);
          },
          failed(self, "training step failed"));
}

void pump_async(self_ptr self) {
  auto& st = self->state;
  admit_workers(self);
  int64_t k = st.plan->config.strategy.max_staleness;
  // Synchronous EASGD: a worker waits at an exchange for the others' previous
  // round, so none may run a whole period ahead.
  if (elastic(st) && st.plan->config.strategy.synchronous) {
    int64_t cap = st.plan->config.strategy.communication_period - 1;
    k = k < 0 ? cap : std::min(k, cap);
  }
  for (std::size_t i = 0; i < st.workers.size() && st.issued < st.boundary; ++i) {
    auto& w = st.workers[i];
    if (!w.alive || !w.admitted || w.busy) continue;
    // Stale synchronous parallel: at most k steps ahead of the slowest.
    if (k >= 0 && w.clock - slowest_clock(st) > k) continue;
    issue_to_worker(self, i);
  }
}

// A lost worker is dropped; its step in flight is given up (never counted).
void lose_worker(self_ptr self, std::size_t i, const std::string& cause) {
  auto& st = self->state;
  auto& w = st.workers[i];
  if (!w.alive) return;
  w.alive = false;
  if (w.busy) --st.issued;
  w.busy = false;
  std::size_t left = 0;
  for (const auto& x : st.workers) left += x.alive ? 1 : 0;
  const auto& tasks = st.plan->replica_tasks;
  std::string task = i < tasks.size() ? tasks[i] : "";
  spdlog::warn("worker {}{} lost ({}); {} workers go on", i, task.empty() ? "" : " on task " + task,
               cause, left);
  update_contributors(self);
  nlohmann::json line{{"type", "worker_lost"},
                      {"worker", i},
                      {"step", st.completed},
                      {"cause", cause},
                      {"workers_left", left}};
  if (!task.empty()) line["task"] = task;
  write_metrics(self, line);
  if (left == 0) {
    fail(self, "every worker is lost (the last: worker " + std::to_string(i) + ", " + cause + ")");
    return;
  }
  if (st.issued == st.completed && st.completed == st.boundary)
    at_boundary(self);
  else
    pump(self);
}

// The replicas that can still answer (parameter_server drops lost workers).
std::vector<replica_actor> live_replicas(const coordinator_state& st) {
  if (st.workers.empty()) return st.replicas;
  std::vector<replica_actor> out;
  for (std::size_t i = 0; i < st.replicas.size(); ++i)
    if (st.workers[i].alive) out.push_back(st.replicas[i]);
  return out;
}

void pump(self_ptr self) {
  auto& st = self->state;
  if (st.finished) return;
  if (async_workers(st)) {
    pump_async(self);
    return;
  }
  while (st.issued < st.boundary && st.issued - st.completed < pipeline_depth)
    issue(self, st.issued++);
}

// Each shard's counters as a metrics line (staleness for parameter_server);
// the latest are kept for the summary.
void write_shard_stats(self_ptr self, int64_t epoch) {
  auto& st = self->state;
  for (std::size_t i = 0; i < st.shards.actors.size(); ++i)
    self->request(st.shards.actors[i], self->state.plan->request_timeout, stats_atom::value)
        .then(
            [self, i, epoch](shard_stats& s) {
              nlohmann::json line{{"type", "shard"},
                                  {"shard", i},
                                  {"epoch", epoch},
                                  {"version", s.version},
                                  {"pushes", s.pushes},
                                  {"pulls", s.pulls},
                                  {"applies", s.applies},
                                  {"bytes_in", s.bytes_in},
                                  {"bytes_out", s.bytes_out},
                                  {"staleness_mean", s.staleness_mean},
                                  {"staleness_max", s.staleness_max}};
              write_metrics(self, line);
              auto& sum = self->state.shard_summary;
              sum["staleness_max"] =
                  std::max<int64_t>(sum.value("staleness_max", int64_t{0}), s.staleness_max);
              sum["staleness_mean"] = s.staleness_mean;
            },
            failed(self, "reading shard statistics failed"));
}

// Reads the replicas' sync-on-read training metrics (resetting them), then
// evaluates on the test set when due, then calls k.
void end_epoch(self_ptr self, std::function<void()> k) {
  auto& st = self->state;
  const auto& p = *st.plan;
  int64_t epoch = (st.completed - 1) / p.steps_per_epoch;
  auto live = live_replicas(st);
  auto sums = std::make_shared<std::pair<metric_sums, int64_t>>(metric_sums{}, live.size());
  for (auto& r : live) {
    self->request(r, self->state.plan->request_timeout, metrics_atom::value, true)
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
                write_shard_stats(self, epoch);
                write_metrics(self, line);
                if (p.options.on_epoch) p.options.on_epoch(line);
                k();
                return;
              }
              write_shard_stats(self, epoch);
              self->request(live_replicas(st).front(), self->state.plan->request_timeout,
                            eval_atom::value, p.test->images, p.test->labels)
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
    self->request(st.replicas[i], self->state.plan->request_timeout, state_atom::value)
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
  if (!st.shards.actors.empty()) {
    // No step is in flight at a boundary: every shard is at the same version.
    auto n = st.shards.actors.size();
    auto states = std::make_shared<std::vector<shard_state>>(n);
    auto left = std::make_shared<std::size_t>(n);
    for (std::size_t i = 0; i < n; ++i)
      self->request(st.shards.actors[i], self->state.plan->request_timeout, state_atom::value)
          .then(
              [self, states, left, i, save](shard_state& s) mutable {
                (*states)[i] = std::move(s);
                if (--*left > 0) return;
                auto& sh = self->state.shards;
                model_state ms;
                try {
                  ms = join_shard_states(*states, sh.place, sh.slot_suffixes);
                } catch (const std::exception& e) {
                  fail(self, std::string("joining the shards' state failed: ") + e.what());
                  return;
                }
                if (!elastic(self->state)) {
                  save(ms);
                  return;
                }
                // EASGD: the center is the model; the optimizer slots (local
                // to each worker) are the first live worker's, so the
                // checkpoint resumes under any strategy; with
                // save_local_copies every worker's variables go beside them
                // (entries that no optimizer reads).
                auto& st = self->state;
                std::vector<std::size_t> asked;
                for (std::size_t i = 0; i < st.replicas.size(); ++i)
                  if (st.workers[i].alive &&
                      (asked.empty() || st.plan->config.checkpoint.save_local_copies))
                    asked.push_back(i);
                auto locals = std::make_shared<std::vector<model_state>>(asked.size());
                auto left = std::make_shared<std::size_t>(asked.size());
                auto all = std::make_shared<model_state>(std::move(ms));
                for (std::size_t k = 0; k < asked.size(); ++k)
                  self->request(st.replicas[asked[k]], self->state.plan->request_timeout,
                                state_atom::value)
                      .then(
                          [locals, left, k, asked, all, save,
                           save_locals = st.plan->config.checkpoint.save_local_copies](
                              model_state& local) mutable {
                            (*locals)[k] = std::move(local);
                            if (--*left > 0) return;
                            all->slots = std::move((*locals)[0].slots);
                            for (std::size_t j = 0; j < asked.size() && save_locals; ++j)
                              for (auto& v : (*locals)[j].variables)
                                all->slots.push_back(
                                    {"local/" + std::to_string(asked[j]) + "/" + v.name,
                                     std::move(v.value)});
                            save(*all);
                          },
                          failed(self, "checkpoint snapshot failed"));
              },
              failed(self, "checkpoint snapshot failed"));
    return;
  }
  // Sharded optimizer slots are gathered by a collective: every replica
  // takes part, and then any of them holds the whole state.
  if (st.plan->config.strategy.kind == "mirrored" && st.plan->config.strategy.shard_optimizer) {
    collect_states(self, [save](std::vector<model_state>& all) mutable { save(all.front()); });
    return;
  }
  self->request(st.replicas.front(), self->state.plan->request_timeout, state_atom::value)
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
  bool check = st.shards.actors.empty() && st.replicas.size() > 1 && every_check >= 0 &&
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
  if (async_workers(st)) {
    admit_workers(self);
    update_contributors(self);  // workers that join later are not counted yet
  }
  pump(self);
}

void restore_replicas(self_ptr self, std::shared_ptr<model_state> shared);

// Restores the checkpoint into the replicas, or the shards (elastic_average:
// both), then starts.
void restore_then_start(self_ptr self) {
  auto& st = self->state;
  const auto& p = *st.plan;
  model_state ms{p.resume_from->variables, p.resume_from->slots};
  if (!st.shards.actors.empty()) {
    std::vector<shard_state> parts;
    try {
      parts = split_model_state(ms, st.shards.place, static_cast<int64_t>(st.shards.actors.size()),
                                st.shards.slot_suffixes, p.start_step);
    } catch (const std::exception& e) {
      fail(self, std::string("the checkpoint does not fit the shards: ") + e.what());
      return;
    }
    auto left = std::make_shared<std::size_t>(parts.size());
    auto shared = std::make_shared<model_state>(std::move(ms));
    for (std::size_t i = 0; i < parts.size(); ++i)
      self->request(st.shards.actors[i], self->state.plan->request_timeout, restore_atom::value,
                    std::move(parts[i]))
          .then(
              [self, left, shared](int64_t) {
                if (--*left > 0) return;
                if (elastic(self->state))  // the workers' slots; they pull the center
                  restore_replicas(self, shared);
                else
                  start(self);
              },
              failed(self, "restoring the checkpoint failed"));
    return;
  }
  restore_replicas(self, std::make_shared<model_state>(std::move(ms)));
}

void restore_replicas(self_ptr self, std::shared_ptr<model_state> shared) {
  auto& st = self->state;
  auto left = std::make_shared<std::size_t>(st.replicas.size());
  for (auto& r : st.replicas)
    self->request(r, self->state.plan->request_timeout, restore_atom::value, *shared)
        .then(
            [self, left](int64_t) {
              if (--*left == 0) start(self);
            },
            failed(self, "restoring the checkpoint failed"));
}

}  // namespace

coordinator_actor::behavior_type coordinator(self_ptr self, std::shared_ptr<const job_plan> plan,
                                             std::vector<replica_actor> replicas,
                                             std::vector<std::pair<std::string, caf::actor>> others,
                                             shard_set shards) {
  auto& st = self->state;
  st.plan = std::move(plan);
  st.replicas = std::move(replicas);
  st.others = std::move(others);
  st.shards = std::move(shards);
  for (std::size_t i = 0; i < st.shards.actors.size(); ++i)
    st.others.emplace_back("variable_shard " + std::to_string(i),
                           caf::actor_cast<caf::actor>(st.shards.actors[i]));
  if (async_workers(st)) {
    st.workers.resize(st.replicas.size());
    if (st.plan->options.join_replica >= 0 &&
        st.plan->options.join_replica < static_cast<int64_t>(st.workers.size()))
      st.workers[static_cast<std::size_t>(st.plan->options.join_replica)].admit_at =
          std::max<int64_t>(1, st.plan->options.join_at_step);
  }
  for (auto& r : st.replicas) self->monitor(r);
  for (auto& [_, a] : st.others) self->monitor(a);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.finished) return;
    std::string who = "an actor";
    std::string cause = dm.reason ? describe(dm.reason) : "exited";
    for (std::size_t i = 0; i < st.replicas.size(); ++i)
      if (dm.source == st.replicas[i].address()) {
        if (async_workers(st)) {
          lose_worker(self, i, cause);
          return;
        }
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
        if (p.resume_from) {
          restore_then_start(self);
        } else {
          start(self);
        }
        return st.done;
      },
      [self](rejoin_atom, int64_t index, replica_actor& r) {
        auto& st = self->state;
        auto i = static_cast<std::size_t>(index);
        if (st.finished || !async_workers(st) || index < 0 || i >= st.workers.size() || !r ||
            st.workers[i].alive)
          return;
        st.replicas[i] = std::move(r);
        self->monitor(st.replicas[i]);
        auto& w = st.workers[i];
        w = worker_status{};
        w.admit_at = std::max<int64_t>(1, st.completed);  // admitted at once, as a late joiner
        spdlog::info("worker {} is back{}", i,
                     i < st.plan->replica_tasks.size() ? " on task " + st.plan->replica_tasks[i]
                                                       : std::string());
        if (st.issued < st.boundary) pump_async(self);
      },
  };
}

}  // namespace troupe
