#include "strategies/actor_learner_driver.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <deque>
#include <numeric>
#include <optional>

#include "actors/fan_in.hpp"
#include "envs/env.hpp"
#include "envs/python_env.hpp"

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

class actor_learner_driver final : public job_driver {
 public:
  actor_learner_driver(const job_plan& plan, std::vector<learner_actor> learners,
                       std::vector<rl_actor_actor> actors, trajectory_queue_actor queue,
                       inference_server_actor server)
      : learners_(std::move(learners)),
        actors_(std::move(actors)),
        queue_(std::move(queue)),
        server_(std::move(server)),
        env_(plan.config.rl.env),
        target_return_(plan.config.training.target_return) {
    const auto& rl = plan.config.rl;
    // Environments start together, so the first episodes to end are the
    // shortest: the job is not declared solved before every environment
    // could have ended its first episode.
    min_env_steps_to_solve_ = rl.actors * rl.envs_per_actor *
                              envs::job_env_spec(envs::env_choice_of(rl)).max_episode_steps;
  }

  // Every actor gets the first weights, then everyone starts.
  void start(coordinator_host& h) override {
    if (learners_.empty()) return h.fail("an actor/learner job needs at least one learner");
    start_env_steps_ = env_steps_;
    h.self()
        ->request(learners_.front(), h.request_timeout(), weights_atom::value)
        .then(
            [this, &h](policy_weights& w) {
              // Central inference: the server holds the weights, actors none.
              if (server_)
                h.self()->send(server_, weights_atom::value, std::move(w));
              else
                latest_ = std::move(w);
              running_ = true;
              for (auto& a : actors_)
                if (a) start_actor(h, a);
              for (auto& l : learners_) h.self()->send(l, run_atom::value);
              spdlog::info("actor/learner job running: {} learners, {} rl_actors on {}",
                           learners_.size(), live_actors(), h.plan().config.rl.env);
            },
            [&h](caf::error& e) { h.fail("learner 0: " + describe(e)); });
  }
  void pump(coordinator_host&) override {}  // learners and actors run by themselves
  std::vector<replica_actor> live(const coordinator_host&) const override { return {}; }

  // Every learner restores the checkpoint; the counters come back from its meta.
  bool restore(coordinator_host& h, std::function<void()>& k) override {
    const auto& snap = *h.plan().resume_from;
    const auto& x = snap.meta.extra;
    if (x.is_object()) {
      env_steps_ = x.value("env_steps", int64_t{0});
      episodes_ = x.value("episodes", int64_t{0});
      if (auto it = x.find("recent_returns"); it != x.end() && it->is_array())
        for (const auto& v : *it)
          if (v.is_number()) recent_.push_back(v.get<double>());
      while (recent_.size() > kWindow) recent_.pop_front();
    }
    model_state ms{snap.variables, snap.slots, {}};
    fan_in<int64_t> restored(
        learners_.size(),
        [this, k](std::vector<int64_t>& versions) {
          spdlog::info("resumed at update {}, {} env steps", versions.front(), env_steps_);
          k();
        },
        [&h](caf::error& e) {
          h.fail("restoring checkpoint " + h.plan().resume_from->dir + ": " + describe(e));
        });
    for (std::size_t i = 0; i < learners_.size(); ++i)
      h.self()
          ->request(learners_[i], h.request_timeout(), restore_atom::value, ms)
          .then(restored.reply(i), restored.error());
    return true;
  }

  // Learner 0's state, between its updates (the others hold the same).
  bool snapshot(coordinator_host& h, std::function<void(model_state&)>& k) override {
    h.self()
        ->request(learners_.front(), h.request_timeout(), state_atom::value)
        .then([k](model_state& ms) { k(ms); },
              [&h](caf::error& e) { h.fail("checkpoint: learner 0: " + describe(e)); });
    return true;
  }
  int64_t checkpoint_step(const model_state& ms, int64_t completed) const override {
    return saved_version(ms, completed);
  }
  nlohmann::json checkpoint_extra() const override {
    return {{"env_steps", env_steps_},
            {"episodes", episodes_},
            {"recent_returns", std::vector<double>(recent_.begin(), recent_.end())}};
  }

  std::string unit() const override { return "update"; }
  std::string progress_line_type() const override { return "train"; }

  void progress(coordinator_host& h, nlohmann::json& line, progress_info& pi) override {
    auto& iv = since_;
    const double now = h.elapsed_seconds();
    const double dt = std::max(now - iv.t, 1e-9);
    const double n = static_cast<double>(std::max<int64_t>(iv.reports, 1));
    const double mean = mean_recent_return(recent_);
    const double env_rate = static_cast<double>(iv.env_steps) / dt;
    line.update({{"env_steps", env_steps_},
                 {"episodes", episodes_},
                 {"mean_return_100", mean},
                 {"policy_loss", iv.policy_loss / n},
                 {"baseline_loss", iv.baseline_loss / n},
                 {"entropy", iv.entropy / n},
                 {"grad_norm", iv.grad_norm / n},
                 {"policy_lag_mean", iv.lag / n},
                 {"policy_lag_max", iv.lag_max},
                 {"queue_depth", last_queue_.depth},
                 {"unrolls_dropped_stale", last_queue_.dropped_stale},
                 {"env_steps_per_second", env_rate},
                 {"updates_per_second", static_cast<double>(iv.updates) / dt},
                 {"actors_live", live_actors()}});
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
    iv = {};
    iv.t = now;
    h.self()
        ->request(queue_, h.request_timeout(), stats_atom::value)
        .then([this](queue_stats& q) { last_queue_ = q; }, [](caf::error&) {});
  }

  std::string stop_reason(const coordinator_host& h) const override {
    const auto& t = h.plan().config.training;
    if (solved_) return "target_return";
    if (t.max_env_steps > 0 && env_steps_ >= t.max_env_steps) return "max_env_steps";
    return {};
  }

  // Every learner stops after the same update (they vote with their
  // gradients), then the actors stop.
  void halt(coordinator_host& h, std::function<void(int64_t)> k) override {
    halting_ = true;
    fan_in<int64_t> halted(
        learners_.size(),
        [this, &h, k](std::vector<int64_t>& versions) {
          for (auto& a : actors_)
            if (a) h.self()->send_exit(a, caf::exit_reason::user_shutdown);
          k(versions.front());
        },
        [&h](caf::error& e) { h.fail("stopping the learners: " + describe(e)); });
    for (std::size_t i = 0; i < learners_.size(); ++i)
      h.self()
          ->request(learners_[i], h.request_timeout(), halt_atom::value)
          .then(halted.reply(i), halted.error());
  }

  void summarize(nlohmann::json& s) const override {
    const double wall = s.value("wall_seconds", 0.0);
    const auto& stop = s.value("stop_reason", std::string());
    s.update({{"env", env_},
              {"learners", learners_.size()},
              {"actors", actors_.size()},
              {"actors_live", live_actors()},
              {"updates", s.value("steps", int64_t{0})},
              {"env_steps", env_steps_},
              {"episodes", episodes_},
              {"mean_return_100", mean_recent_return(recent_)},
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
  }

  void on_learned(coordinator_host& h, learner_report& r) override {
    // Learners update in lockstep: learner 0 speaks for them.
    if (r.learner != 0) return;
    // A diverged job stops at once, naming the update, instead of acting on
    // a NaN policy to the end.
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
      return h.fail(
          fmt::format("training diverged at update {}: loss {:g}, gradient norm {:g} (a lower "
                      "optimizer.learning_rate or rl.grad_clip may help)",
                      r.version, r.loss, r.grad_norm));
    auto& iv = since_;
    ++iv.updates;
    ++iv.reports;
    iv.policy_loss += r.policy_loss;
    iv.baseline_loss += r.baseline_loss;
    iv.entropy += r.entropy;
    iv.grad_norm += r.grad_norm;
    iv.lag += r.lag_mean;
    iv.lag_max = std::max(iv.lag_max, r.lag_max);
    step_stats s;
    s.loss_sum = r.loss * static_cast<double>(r.samples);
    s.count = r.samples;
    h.step_done(s);
  }

  void on_episodes(coordinator_host& h, episode_report& r) override {
    env_steps_ += r.env_steps;
    since_.env_steps += r.env_steps;
    for (double ret : r.returns) {
      recent_.push_back(ret);
      if (recent_.size() > kWindow) recent_.pop_front();
      ++episodes_;
      if (recent_.size() >= std::min<std::size_t>(kWindow, 10))
        best_mean_return_ = std::max(best_mean_return_, mean_recent_return(recent_));
    }
    const auto& target = target_return_;
    if (!solved_ && target && recent_.size() >= kWindow && env_steps_ >= min_env_steps_to_solve_ &&
        mean_recent_return(recent_) >= *target) {
      solved_ = true;
      time_to_solve_ = h.elapsed_seconds();
      env_steps_to_solve_ = env_steps_;
      spdlog::info(
          "solved: mean return of the last 100 episodes {:.1f} >= {} after {} env steps, {:.2f} s",
          mean_recent_return(recent_), *target, env_steps_, time_to_solve_);
    }
  }

  void on_weights(coordinator_host& h, policy_weights& w) override {
    latest_ = std::move(w);
    for (auto& a : actors_)
      if (a) h.self()->send(a, weights_atom::value, *latest_);
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
    if (running_) start_actor(h, a);
  }

 private:
  int64_t live_actors() const {
    int64_t n = 0;
    for (const auto& a : actors_) n += a ? 1 : 0;
    return n;
  }
  void start_actor(coordinator_host& h, const rl_actor_actor& a) {
    if (latest_) h.self()->send(a, weights_atom::value, *latest_);
    h.self()->send(a, run_atom::value);
  }

  std::vector<learner_actor> learners_;
  std::vector<rl_actor_actor> actors_;  // by index; null while lost
  trajectory_queue_actor queue_;
  inference_server_actor server_;  // central inference only
  std::string env_;
  bool running_ = false, halting_ = false, solved_ = false;
  int64_t env_steps_ = 0, episodes_ = 0, start_env_steps_ = 0;
  std::deque<double> recent_;  // returns of the last 100 episodes
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
  queue_stats last_queue_;
  std::optional<policy_weights> latest_;
};

}  // namespace

std::unique_ptr<job_driver> make_actor_learner_driver(const job_plan& plan,
                                                      std::vector<learner_actor> learners,
                                                      std::vector<rl_actor_actor> actors,
                                                      trajectory_queue_actor queue,
                                                      inference_server_actor server) {
  return std::make_unique<actor_learner_driver>(plan, std::move(learners), std::move(actors),
                                                std::move(queue), std::move(server));
}

}  // namespace troupe
