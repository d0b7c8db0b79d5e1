#include "strategies/actor_learner_driver.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "actors/fan_in.hpp"
#include "envs/env.hpp"
#include "envs/python_env.hpp"
#include "strategies/population.hpp"

namespace troupe {
namespace {

constexpr std::size_t kWindow = 100;  // episodes in the mean return

// The mean return of the last 100 episodes (of fewer when fewer ended).
double mean_recent_return(const std::deque<double>& recent) {
  if (recent.empty()) return 0;
  return std::accumulate(recent.begin(), recent.end(), 0.0) / static_cast<double>(recent.size());
}

// The step count a learner's state was saved at ("optimizer/step").
int64_t saved_version(const model_state& ms, int64_t fallback) {
  for (const auto& s : ms.slots)
    if (s.name == "optimizer/step" && s.value.type() == dtype::i64 && s.value.numel() == 1)
      return s.value.data<int64_t>()[0];
  return fallback;
}

bool finite_weights(const policy_weights& w) {
  for (const auto& t : w.values)
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t.f32()[i])) return false;
  return true;
}

// One member's learners and queue (the job's only ones outside a
// population), its returns and its newest weights.
struct member_group {
  std::vector<learner_actor> learners;
  trajectory_queue_actor queue;
  std::deque<double> recent;  // its last 100 returns (since its last exploit)
  std::optional<policy_weights> latest;
  queue_stats last_queue;
  member_hyperparameters hyperparameters;  // rl.population only
  bool diverged = false;                   // rl.population: until it exploits
};

class actor_learner_driver final : public job_driver {
 public:
  actor_learner_driver(const job_plan& plan, actor_learner_parts parts,
                       std::vector<rl_actor_actor> actors)
      : actors_(std::move(actors)),
        server_(std::move(parts.server)),
        controller_(std::move(parts.controller)),
        env_(plan.config.rl.env),
        target_return_(plan.config.training.target_return) {
    const auto& rl = plan.config.rl;
    for (std::size_t m = 0; m < parts.members.size(); ++m) {
      member_group g;
      g.learners = std::move(parts.members[m]);
      g.queue = parts.queues.at(m);
      if (m < parts.hyperparameters.size()) g.hyperparameters = parts.hyperparameters[m];
      members_.push_back(std::move(g));
    }
    interval_env_steps_ = rl.population.interval_env_steps;
    next_round_ = interval_env_steps_;
    // Environments start together, so the first episodes to end are the
    // shortest: the job is not declared solved before every environment
    // could have ended its first episode.
    min_env_steps_to_solve_ = rl.actors * rl.envs_per_actor *
                              envs::job_env_spec(envs::env_choice_of(rl)).max_episode_steps;
  }

  // Every actor gets its member's first weights, then everyone starts.
  void start(coordinator_host& h) override {
    if (members_.empty() || members_.front().learners.empty())
      return h.fail("an actor/learner job needs at least one learner");
    start_env_steps_ = env_steps_;
    fan_in<policy_weights> first(
        members_.size(),
        [this, &h](std::vector<policy_weights>& ws) {
          for (std::size_t m = 0; m < ws.size(); ++m) {
            // Central inference: the server holds the weights, actors none.
            if (server_)
              h.self()->send(server_, weights_atom::value, std::move(ws[m]));
            else
              members_[m].latest = std::move(ws[m]);
          }
          running_ = true;
          for (std::size_t i = 0; i < actors_.size(); ++i)
            if (actors_[i]) start_actor(h, i);
          for (auto& g : members_)
            for (auto& l : g.learners) h.self()->send(l, run_atom::value);
          spdlog::info("actor/learner job running: {} learners{}, {} rl_actors on {}",
                       members_.size() * members_.front().learners.size(),
                       controller_ ? fmt::format(" in {} members", members_.size()) : "",
                       live_actors(), h.plan().config.rl.env);
        },
        [&h](caf::error& e) { h.fail("learner 0: " + describe(e)); });
    for (std::size_t m = 0; m < members_.size(); ++m)
      h.self()
          ->request(members_[m].learners.front(), h.request_timeout(), weights_atom::value)
          .then(first.reply(m), first.error());
  }
  void pump(coordinator_host&) override {}  // learners and actors run by themselves
  std::vector<replica_actor> live(const coordinator_host&) const override { return {}; }

  // Every learner restores the checkpoint (a population's members all start
  // from its best member, each with its own saved hyperparameters); the
  // counters come back from its meta.
  bool restore(coordinator_host& h, std::function<void()>& k) override {
    const auto& snap = *h.plan().resume_from;
    restore_counters(snap.meta.extra);
    model_state ms{snap.variables, snap.slots, {}};
    std::vector<learner_actor> all;
    for (const auto& g : members_) all.insert(all.end(), g.learners.begin(), g.learners.end());
    fan_in<int64_t> restored(
        all.size(),
        [this, &h, k](std::vector<int64_t>& versions) {
          spdlog::info("resumed at update {}, {} env steps", versions.front(), env_steps_);
          restore_population(h, k);
        },
        [&h](caf::error& e) {
          h.fail("restoring checkpoint " + h.plan().resume_from->dir + ": " + describe(e));
        });
    for (std::size_t i = 0; i < all.size(); ++i)
      h.self()
          ->request(all[i], h.request_timeout(), restore_atom::value, ms)
          .then(restored.reply(i), restored.error());
    return true;
  }

  // The best member's state, between its updates (its other learners hold
  // the same).
  bool snapshot(coordinator_host& h, std::function<void(model_state&)>& k) override {
    const auto best = best_member();
    h.self()
        ->request(members_[best].learners.front(), h.request_timeout(), state_atom::value)
        .then([k](model_state& ms) { k(ms); },
              [&h](caf::error& e) { h.fail("checkpoint: learner 0: " + describe(e)); });
    return true;
  }
  // A population's checkpoint is its best member's, at that member's own
  // optimizer step (the slots must agree with the step they were saved at).
  int64_t checkpoint_step(const model_state& ms, int64_t completed) const override {
    return saved_version(ms, completed);
  }
  nlohmann::json checkpoint_extra() const override {
    const auto& recent = members_[best_member()].recent;
    nlohmann::json x = {{"env_steps", env_steps_},
                        {"episodes", episodes_},
                        {"recent_returns", std::vector<double>(recent.begin(), recent.end())}};
    if (controller_) x["population"] = population_json();
    return x;
  }

  std::string unit() const override { return "update"; }
  std::string progress_line_type() const override { return "train"; }

  void progress(coordinator_host& h, nlohmann::json& line, progress_info& pi) override {
    auto& iv = since_;
    const double now = h.elapsed_seconds();
    const double dt = std::max(now - iv.t, 1e-9);
    const double n = static_cast<double>(std::max<int64_t>(iv.reports, 1));
    const double mean = mean_recent_return(members_[best_member()].recent);
    const double env_rate = static_cast<double>(iv.env_steps) / dt;
    queue_stats q;
    for (const auto& g : members_) {
      q.depth += g.last_queue.depth;
      q.dropped_stale += g.last_queue.dropped_stale;
    }
    line.update({{"env_steps", env_steps_},
                 {"episodes", episodes_},
                 {"mean_return_100", mean},
                 {"policy_loss", iv.policy_loss / n},
                 {"baseline_loss", iv.baseline_loss / n},
                 {"entropy", iv.entropy / n},
                 {"grad_norm", iv.grad_norm / n},
                 {"policy_lag_mean", iv.lag / n},
                 {"policy_lag_max", iv.lag_max},
                 {"queue_depth", q.depth},
                 {"unrolls_dropped_stale", q.dropped_stale},
                 {"env_steps_per_second", env_rate},
                 {"updates_per_second", static_cast<double>(iv.updates) / dt},
                 {"actors_live", live_actors()}});
    if (server_) line.update(inference_json());
    if (controller_) {
      // The members in an array, and the best one's figures as numbers
      // (what TensorBoard and Prometheus take).
      const auto& best = members_[best_member()];
      line["population"] = population_json();
      line["best_member"] = best_member();
      line["best_learning_rate"] = best.hyperparameters.learning_rate;
      line["best_entropy_cost"] = best.hyperparameters.entropy_cost;
    }
    progress_info_of(h, mean, env_rate, pi);
    iv = {};
    iv.t = now;
    for (auto& g : members_)
      h.self()
          ->request(g.queue, h.request_timeout(), stats_atom::value)
          .then([&g](queue_stats& s) { g.last_queue = s; }, [](caf::error&) {});
    if (server_)
      h.self()
          ->request(server_, h.request_timeout(), stats_atom::value)
          .then([this](inference_stats& s) { last_inference_ = s; }, [](caf::error&) {});
  }

  // The inference server's counters as of the last metrics line (how full
  // its batches run: the figure rl.central.max_batch and max_wait_us tune).
  nlohmann::json inference_json() const {
    const auto& s = last_inference_;
    return {{"inference_batches", s.batches},
            {"inference_overdue_batches", s.overdue_batches},
            {"inference_in_process_batches", s.in_process_batches},
            {"inference_rows_per_batch",
             s.batches > 0 ? static_cast<double>(s.rows) / static_cast<double>(s.batches) : 0.0}};
  }

  std::string stop_reason(const coordinator_host& h) const override {
    const auto& t = h.plan().config.training;
    if (solved_) return "target_return";
    if (t.max_env_steps > 0 && env_steps_ >= t.max_env_steps) return "max_env_steps";
    return {};
  }

  // Every learner stops after the same update (a member's vote with their
  // gradients), then the actors stop.
  void halt(coordinator_host& h, std::function<void(int64_t)> k) override {
    halting_ = true;
    // A population's round in flight ends first: its exploits are all in
    // the metrics and the summary.
    if (round_in_flight_) {
      after_round_ = [this, &h, k] { halt_learners(h, k); };
      return;
    }
    halt_learners(h, std::move(k));
  }

  void halt_learners(coordinator_host& h, std::function<void(int64_t)> k) {
    std::vector<learner_actor> all;
    for (const auto& g : members_) all.insert(all.end(), g.learners.begin(), g.learners.end());
    fan_in<int64_t> halted(
        all.size(),
        [this, &h, k](std::vector<int64_t>& versions) {
          for (auto& a : actors_)
            if (a) h.self()->send_exit(a, caf::exit_reason::user_shutdown);
          // A population's updates are the coordinator's count over members.
          k(controller_ ? -1 : versions.front());
        },
        [&h](caf::error& e) { h.fail("stopping the learners: " + describe(e)); });
    for (std::size_t i = 0; i < all.size(); ++i)
      h.self()
          ->request(all[i], h.request_timeout(), halt_atom::value)
          .then(halted.reply(i), halted.error());
  }

  void summarize(nlohmann::json& s) const override {
    const double wall = s.value("wall_seconds", 0.0);
    const auto& stop = s.value("stop_reason", std::string());
    s.update({{"env", env_},
              {"learners", members_.size() * members_.front().learners.size()},
              {"actors", actors_.size()},
              {"actors_live", live_actors()},
              {"updates", s.value("steps", int64_t{0})},
              {"env_steps", env_steps_},
              {"episodes", episodes_},
              {"mean_return_100", mean_recent_return(members_[best_member()].recent)},
              {"best_mean_return_100", episodes_ > 0 ? best_mean_return_ : 0.0},
              {"solved", time_to_solve_ >= 0},
              {"time_to_solve_seconds",
               time_to_solve_ >= 0 ? nlohmann::json(time_to_solve_) : nlohmann::json()},
              {"env_steps_to_solve",
               time_to_solve_ >= 0 ? nlohmann::json(env_steps_to_solve_) : nlohmann::json()},
              {"stop_reason", stop.empty() ? std::string("max_steps") : stop},
              {"env_steps_per_second",
               static_cast<double>(env_steps_ - start_env_steps_) / std::max(wall, 1e-9)},
              {"updates_per_second",
               static_cast<double>(s.value("steps_this_run", int64_t{0})) / std::max(wall, 1e-9)}});
    if (target_return_) s["target_return"] = *target_return_;
    if (server_) s.update(inference_json());
    if (controller_) {
      s["population"] = population_json();
      s["population"]["rounds"] = rounds_;
      s["population"]["exploits"] = exploits_;
    }
  }

  void on_learned(coordinator_host& h, learner_report& r) override {
    // A member's learners update in lockstep: its learner 0 speaks for them.
    if (r.learner != 0) return;
    const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
    // A diverged job stops at once, naming the update, instead of acting on
    // a NaN policy to the end; a diverged member of a population is ranked
    // last until it exploits (its weights are not sent meanwhile).
    if (!finite && controller_) {
      member_diverged(h, r.member);
    } else if (!finite) {
      return h.fail(
          fmt::format("training diverged at update {}: loss {:g}, gradient norm {:g} (a lower "
                      "optimizer.learning_rate or rl.grad_clip may help)",
                      r.version, r.loss, r.grad_norm));
    }
    auto& iv = since_;
    ++iv.updates;
    if (finite) {
      ++iv.reports;
      iv.policy_loss += r.policy_loss;
      iv.baseline_loss += r.baseline_loss;
      iv.entropy += r.entropy;
      iv.grad_norm += r.grad_norm;
      iv.lag += r.lag_mean;
      iv.lag_max = std::max(iv.lag_max, r.lag_max);
    }
    step_stats s;
    s.loss_sum = finite ? r.loss * static_cast<double>(r.samples) : 0;
    s.count = r.samples;
    h.step_done(s);
  }

  void on_episodes(coordinator_host& h, episode_report& r) override {
    env_steps_ += r.env_steps;
    since_.env_steps += r.env_steps;
    auto& recent = members_[member_of(r.actor)].recent;
    for (double ret : r.returns) {
      recent.push_back(ret);
      if (recent.size() > kWindow) recent.pop_front();
      ++episodes_;
      if (recent.size() >= std::min<std::size_t>(kWindow, 10))
        best_mean_return_ = std::max(best_mean_return_, mean_recent_return(recent));
    }
    check_solved(h);
    maybe_round(h);
  }

  void on_weights(coordinator_host& h, policy_weights& w) override {
    const auto m = static_cast<std::size_t>(w.member);
    if (m >= members_.size()) return;
    if (controller_ && !finite_weights(w)) return member_diverged(h, w.member);
    members_[m].latest = std::move(w);
    for (std::size_t i = 0; i < actors_.size(); ++i)
      if (actors_[i] && member_of(static_cast<int64_t>(i)) == m)
        h.self()->send(actors_[i], weights_atom::value, *members_[m].latest);
  }

  bool actor_lost(coordinator_host& h, const caf::actor_addr& who,
                  const std::string& cause) override {
    for (std::size_t i = 0; i < actors_.size(); ++i) {
      if (!actors_[i] || actors_[i].address() != who) continue;
      if (halting_) return true;  // stopped by the job itself
      actors_[i] = nullptr;
      spdlog::warn("rl_actor {} lost ({}); {} of {} actors go on", i, cause, live_actors(),
                   actors_.size());
      h.write_metrics({{"type", "actor_lost"},
                       {"actor", i},
                       {"cause", cause},
                       {"step", h.completed()},
                       {"actors_live", live_actors()}});
      if (live_actors() == 0)
        h.fail("every rl_actor is lost (the last: rl_actor " + std::to_string(i) + ": " + cause +
               ")");
      return true;
    }
    return false;
  }

  void rejoin(coordinator_host& h, std::size_t index, caf::actor handle) override {
    auto a = caf::actor_cast<rl_actor_actor>(handle);
    if (halting_ || !a) return;
    // Indices are the placement's (rl.actors of them): a rejoin under any
    // other names no actor of this job, and must not grow the table.
    if (index >= actors_.size()) {
      spdlog::warn("rejoin of rl_actor {} ignored: the job has {} rl_actors", index,
                   actors_.size());
      return;
    }
    auto& slot = actors_[index];
    if (slot && slot != a) h.self()->demonitor(slot.address());
    slot = a;
    h.self()->monitor(a);
    spdlog::info("rl_actor {} joined; {} actors live", index, live_actors());
    h.write_metrics({{"type", "actor_joined"},
                     {"actor", index},
                     {"step", h.completed()},
                     {"actors_live", live_actors()}});
    if (running_) start_actor(h, index);
  }

 private:
  int64_t live_actors() const {
    int64_t n = 0;
    for (const auto& a : actors_) n += a ? 1 : 0;
    return n;
  }
  // rl_actor i acts for member i mod N.
  std::size_t member_of(int64_t actor) const {
    return static_cast<std::size_t>(actor) % members_.size();
  }
  void start_actor(coordinator_host& h, std::size_t i) {
    const auto& latest = members_[member_of(static_cast<int64_t>(i))].latest;
    if (latest) h.self()->send(actors_[i], weights_atom::value, *latest);
    h.self()->send(actors_[i], run_atom::value);
  }

  // The member with the highest mean recent return (of those with returns;
  // member 0 before any): the job's measure and checkpoint.
  std::size_t best_member() const {
    std::size_t best = 0;
    double best_mean = 0;
    bool any = false;
    for (std::size_t m = 0; m < members_.size(); ++m) {
      const auto& g = members_[m];
      if (g.recent.empty() || g.diverged) continue;
      const double mean = mean_recent_return(g.recent);
      if (!any || mean > best_mean) best = m, best_mean = mean, any = true;
    }
    return best;
  }

  void check_solved(coordinator_host& h) {
    const auto& recent = members_[best_member()].recent;
    const auto& target = target_return_;
    if (solved_ || !target || recent.size() < kWindow || env_steps_ < min_env_steps_to_solve_ ||
        mean_recent_return(recent) < *target)
      return;
    solved_ = true;
    time_to_solve_ = h.elapsed_seconds();
    env_steps_to_solve_ = env_steps_;
    spdlog::info(
        "solved: mean return of the last 100 episodes {:.1f} >= {} after {} env steps, {:.2f} s",
        mean_recent_return(recent), *target, env_steps_, time_to_solve_);
  }

  void progress_info_of(coordinator_host& h, double mean, double env_rate, progress_info& pi) {
    const int64_t max_env_steps = h.plan().config.training.max_env_steps;
    pi.figures = {{"env_steps", env_steps_},
                  {"episodes", episodes_},
                  {"mean_return_100", mean},
                  {"env_steps_per_second", env_rate}};
    pi.measure = "env steps " + std::to_string(env_steps_) +
                 (max_env_steps > 0 ? " (" + std::to_string(100 * env_steps_ / max_env_steps) + "%)"
                                    : std::string()) +
                 "  episodes " + std::to_string(episodes_) + "  mean return (100) " +
                 fmt::format("{:.1f}  {:.0f} env steps/s", mean, env_rate);
    if (controller_)
      pi.measure += fmt::format("  best member {} (learning rate {:.3g})", best_member(),
                                members_[best_member()].hyperparameters.learning_rate);
  }

  void restore_counters(const nlohmann::json& x) {
    if (!x.is_object()) return;
    env_steps_ = x.value("env_steps", int64_t{0});
    episodes_ = x.value("episodes", int64_t{0});
    next_round_ = env_steps_ + interval_env_steps_;
    // A population's members start their returns afresh (they all resume
    // from the best member's state).
    if (auto it = x.find("recent_returns"); !controller_ && it != x.end() && it->is_array())
      for (const auto& v : *it)
        if (v.is_number()) members_.front().recent.push_back(v.get<double>());
    while (members_.front().recent.size() > kWindow) members_.front().recent.pop_front();
    const auto pop = x.find("population");
    if (!controller_ || pop == x.end() || !pop->is_object()) return;
    const auto saved = pop->value("members", nlohmann::json::array());
    if (saved.size() != members_.size()) return;
    for (std::size_t m = 0; m < members_.size(); ++m) {
      members_[m].hyperparameters.learning_rate = saved[m].value("learning_rate", 0.0);
      members_[m].hyperparameters.entropy_cost = saved[m].value("entropy_cost", 0.0);
    }
    restored_hyperparameters_ = true;
  }

  // A resumed population's hyperparameters go to the controller, which
  // hands them to the learners; then k.
  void restore_population(coordinator_host& h, const std::function<void()>& k) {
    if (!controller_ || !restored_hyperparameters_) return k();
    std::vector<member_hyperparameters> hp;
    for (const auto& g : members_) hp.push_back(g.hyperparameters);
    h.self()
        ->request(controller_, h.request_timeout(), hyperparameters_atom::value, std::move(hp))
        .then([k](int64_t) { k(); },
              [&h](caf::error& e) { h.fail("population controller: " + describe(e)); });
  }

  void member_diverged(coordinator_host& h, int64_t member) {
    auto& g = members_.at(static_cast<std::size_t>(member));
    if (g.diverged) return;
    g.diverged = true;
    spdlog::warn(
        "population member {} diverged (learning rate {:.3g}); ranked last until it "
        "exploits",
        member, g.hyperparameters.learning_rate);
    h.write_metrics({{"type", "population_diverged"},
                     {"member", member},
                     {"env_steps", env_steps_},
                     {"learning_rate", g.hyperparameters.learning_rate}});
  }

  // Every interval_env_steps, one round at a time: the members' scores to
  // the controller; its events are logged, and each member that exploited
  // starts its returns afresh.
  void maybe_round(coordinator_host& h) {
    if (!controller_ || round_in_flight_ || halting_ || env_steps_ < next_round_) return;
    next_round_ = env_steps_ + interval_env_steps_;
    std::vector<member_score> scores;
    for (std::size_t m = 0; m < members_.size(); ++m) {
      const auto& g = members_[m];
      member_score s{static_cast<int64_t>(m), mean_recent_return(g.recent),
                     static_cast<int64_t>(g.recent.size())};
      if (g.diverged) s = {static_cast<int64_t>(m), std::numeric_limits<double>::lowest(), 1};
      scores.push_back(s);
    }
    round_in_flight_ = true;
    h.self()
        ->request(controller_, h.request_timeout(), round_atom::value, std::move(scores))
        .then([this, &h](population_round& r) { on_round(h, r); },
              [this, &h](caf::error& e) {
                round_in_flight_ = false;
                h.fail("population controller: " + describe(e));
                if (after_round_) std::exchange(after_round_, nullptr)();
              });
  }

  void on_round(coordinator_host& h, population_round& r) {
    round_in_flight_ = false;
    ++rounds_;
    for (const auto& e : r.events) {
      auto& g = members_.at(static_cast<std::size_t>(e.member));
      g.recent.clear();
      g.diverged = false;
      ++exploits_;
      h.write_metrics(population_line(e, env_steps_));
    }
    for (std::size_t m = 0; m < members_.size() && m < r.members.size(); ++m)
      members_[m].hyperparameters = r.members[m];
    if (after_round_) std::exchange(after_round_, nullptr)();
  }

  nlohmann::json population_json() const {
    auto members = nlohmann::json::array();
    for (std::size_t m = 0; m < members_.size(); ++m) {
      const auto& g = members_[m];
      members.push_back({{"member", m},
                         {"learning_rate", g.hyperparameters.learning_rate},
                         {"entropy_cost", g.hyperparameters.entropy_cost},
                         {"mean_return", mean_recent_return(g.recent)},
                         {"episodes", g.recent.size()}});
    }
    return {{"best_member", best_member()}, {"members", std::move(members)}};
  }

  std::vector<member_group> members_;
  std::vector<rl_actor_actor> actors_;      // by index; null while lost
  inference_server_actor server_;           // central inference only
  inference_stats last_inference_;          // its counters, at the last metrics line
  population_controller_actor controller_;  // rl.population only
  std::string env_;
  bool running_ = false, halting_ = false, solved_ = false;
  bool round_in_flight_ = false, restored_hyperparameters_ = false;
  std::function<void()> after_round_;  // a halt waiting for the round in flight
  int64_t env_steps_ = 0, episodes_ = 0, start_env_steps_ = 0;
  int64_t interval_env_steps_ = 0, next_round_ = 0, rounds_ = 0, exploits_ = 0;
  int64_t min_env_steps_to_solve_ = 0;
  double best_mean_return_ = -1e300;
  double time_to_solve_ = -1;
  int64_t env_steps_to_solve_ = 0;
  std::optional<double> target_return_;
  // Since the last metrics line.
  struct interval {
    double t = 0;
    int64_t updates = 0, env_steps = 0, reports = 0;
    double policy_loss = 0, baseline_loss = 0, entropy = 0, grad_norm = 0, lag = 0;
    int64_t lag_max = 0;
  } since_;
};

}  // namespace

std::unique_ptr<job_driver> make_actor_learner_driver(const job_plan& plan,
                                                      actor_learner_parts parts,
                                                      std::vector<rl_actor_actor> actors) {
  return std::make_unique<actor_learner_driver>(plan, std::move(parts), std::move(actors));
}

}  // namespace troupe
