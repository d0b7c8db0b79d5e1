// A strategy that runs no dataset, defined in this one file and run through
// the same path as `troupe run` (run_job) and the same coordinator as every
// other strategy, as test_strategies.cpp does for a classifier strategy.
//
// "episode_sampler": workers placed like replicas step CartPole with a
// uniformly random policy in unrolls of T steps of M environments and
// report each unroll's episodes to the job's coordinator; the strategy's
// driver books every unroll as one update, its progress measure is the
// environment steps, episodes and mean return, and it stops the job once
// training.max_env_steps environment steps were taken. (Random search's
// baseline: the return a policy must beat.)
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <random>

#include <spdlog/spdlog.h>

#include "envs/env.hpp"
#include "runtime/job.hpp"
#include "strategies/strategy.hpp"
#include "tests/fixtures.hpp"

using namespace troupe;

namespace {

constexpr int64_t kSteps = 10;  // T
constexpr int64_t kEnvs = 4;    // M

// One worker: an unroll per `run`, then the next `run` to itself a moment
// later: a mailbox that never runs empty would keep the actor on its
// scheduler thread for ever (CAF's default throughput is unbounded), where
// the real rl_actor waits for the trajectory queue's answer.
using sampler_actor = caf::typed_actor<caf::reacts_to<run_atom>>;

sampler_actor::behavior_type sampler(sampler_actor::pointer self, rl_reports_actor coordinator,
                                     int64_t index, uint64_t seed) {
  auto env = std::shared_ptr<envs::vector_env>(envs::make_env("CartPole-v1", kEnvs));
  const auto& spec = env->spec();
  auto obs = std::make_shared<std::vector<float>>(kEnvs * spec.observation_size);
  env->reset(seed + static_cast<uint64_t>(index), obs->data());
  auto rng = std::make_shared<std::mt19937_64>(seed * 31 + static_cast<uint64_t>(index));
  return {
      [=](run_atom) {
        std::vector<float> reward(kEnvs), final_obs(obs->size());
        std::vector<uint8_t> terminated(kEnvs), truncated(kEnvs);
        std::vector<double> returns(kEnvs);
        std::vector<int64_t> lengths(kEnvs);
        std::vector<int32_t> actions(kEnvs);
        episode_report r;
        r.actor = index;
        for (int64_t t = 0; t < kSteps; ++t) {
          for (auto& a : actions) a = static_cast<int32_t>((*rng)() % 2);
          env->step(actions.data(),
                    {obs->data(), reward.data(), terminated.data(), truncated.data(),
                     final_obs.data(), returns.data(), lengths.data()});
          for (int64_t m = 0; m < kEnvs; ++m)
            if (terminated[m] || truncated[m]) {
              r.returns.push_back(returns[m]);
              r.lengths.push_back(lengths[m]);
            }
        }
        r.env_steps = kSteps * kEnvs;
        self->send(coordinator, episodes_atom::value, std::move(r));
        self->delayed_send(self, std::chrono::microseconds(200), run_atom::value);
      },
  };
}

class sampler_driver final : public job_driver {
 public:
  explicit sampler_driver(std::vector<sampler_actor> workers) : workers_(std::move(workers)) {}

  void start(coordinator_host& h) override {
    for (auto& w : workers_) h.self()->send(w, run_atom::value);
  }
  void pump(coordinator_host&) override {}
  std::vector<replica_actor> live(const coordinator_host&) const override { return {}; }

  // Each unroll is one update of the job.
  void on_episodes(coordinator_host& h, episode_report& r) override {
    env_steps_ += r.env_steps;
    for (double ret : r.returns) {
      ++episodes_;
      return_sum_ += ret;
    }
    step_stats s;
    s.count = r.env_steps;
    h.step_done(s);
  }
  std::string unit() const override { return "unroll"; }
  std::string progress_line_type() const override { return "sample"; }
  void progress(coordinator_host&, nlohmann::json& line, progress_info& pi) override {
    line["env_steps"] = env_steps_;
    line["episodes"] = episodes_;
    pi.figures = {{"env_steps", env_steps_}, {"episodes", episodes_}};
    pi.measure =
        "env steps " + std::to_string(env_steps_) + "  episodes " + std::to_string(episodes_);
  }
  std::string stop_reason(const coordinator_host& h) const override {
    return env_steps_ >= h.plan().config.training.max_env_steps ? "max_env_steps" : "";
  }
  void halt(coordinator_host& h, std::function<void(int64_t)> k) override {
    for (auto& w : workers_) h.self()->send_exit(w, caf::exit_reason::user_shutdown);
    halted_ = true;
    k(-1);
  }
  bool actor_lost(coordinator_host&, const caf::actor_addr&, const std::string&) override {
    return halted_;  // the workers this driver stopped
  }
  void summarize(nlohmann::json& s) const override {
    s["env_steps"] = env_steps_;
    s["episodes"] = episodes_;
    s["mean_return"] = episodes_ > 0 ? return_sum_ / static_cast<double>(episodes_) : 0.0;
  }

 private:
  std::vector<sampler_actor> workers_;
  int64_t env_steps_ = 0, episodes_ = 0;
  double return_sum_ = 0;
  bool halted_ = false;
};

// The chief's side holds nothing but the coordinator's handle for the workers.
class sampler_hub final : public job_hub {
 public:
  explicit sampler_hub(const coordinator_actor& c) : coordinator_(c) {}
  caf::message handles() const override {
    return caf::make_message(rl_reports_actor{coordinator_});
  }
  std::vector<std::pair<std::string, caf::actor>> named() const override { return {}; }
  std::unique_ptr<job_driver> make_driver(
      std::vector<std::pair<int64_t, caf::actor>> workers) override {
    std::vector<sampler_actor> all;
    for (auto& [_, w] : workers) all.push_back(caf::actor_cast<sampler_actor>(w));
    return std::make_unique<sampler_driver>(std::move(all));
  }
  void stop() override {}

 private:
  coordinator_actor coordinator_;
};

class episode_sampler final : public strategy {
 public:
  std::string name() const override { return "episode_sampler"; }
  bool trains_classifier() const override { return false; }
  std::string replica_unit() const override { return "sampler"; }
  int64_t replica_count(const job_config&) const override { return 3; }
  bool own_job() const override { return true; }
  std::unique_ptr<job_hub> spawn_hub(caf::actor_system&, std::shared_ptr<const job_plan>,
                                     const coordinator_actor& coordinator) const override {
    return std::make_unique<sampler_hub>(coordinator);
  }
  worker_parts spawn_own_workers(caf::actor_system& sys, std::shared_ptr<const job_plan> plan,
                                 const worker_spec& spec, const caf::message& hub) const override {
    if (!hub.match_elements<rl_reports_actor>())
      throw job_error("episode_sampler: the build order carries no coordinator");
    worker_parts out;
    out.indices = spec.indices;
    for (auto index : spec.indices)
      out.others.push_back(
          caf::actor_cast<caf::actor>(sys.spawn(sampler, hub.get_as<rl_reports_actor>(0), index,
                                                static_cast<uint64_t>(plan->config.seed))));
    return out;
  }
};

const strategy_registration registered{std::make_shared<episode_sampler>()};

}  // namespace

TEST_CASE("a strategy with a job of its own runs through the one coordinator") {
  spdlog::set_level(spdlog::level::warn);
  auto dir = std::filesystem::temp_directory_path() / "troupe_test_own_job";
  std::filesystem::remove_all(dir);
  job_config c;
  c.name = "sampler";
  c.strategy.kind = "episode_sampler";
  c.devices = {"cpu:0"};
  c.training.max_steps = 0;  // the strategy's own stop ends the job
  c.training.max_env_steps = 4000;
  c.logging.every_steps = 5;
  c.logging.output_dir = dir.string();
  c.checkpoint.save_at_end = false;

  std::atomic<int> reports{0};
  std::string last_measure;
  job_options o;
  o.on_progress = [&](const progress_info& p) {
    ++reports;
    CHECK(p.unit == "unroll");
    CHECK(p.total_steps == 0);
    last_measure = p.measure;
  };
  auto s = run_job(c, o);

  const int64_t per_unroll = kSteps * kEnvs;
  CHECK(s["strategy"] == "episode_sampler");
  CHECK(s["stop_reason"] == "max_env_steps");
  const auto steps = s["steps"].get<int64_t>();
  const auto env_steps = s["env_steps"].get<int64_t>();
  // Every booked update is one unroll; reports after the stop are not counted.
  CHECK(env_steps == steps * per_unroll);
  CHECK(env_steps >= c.training.max_env_steps);
  CHECK(env_steps < c.training.max_env_steps + per_unroll);
  CHECK(s["samples"].get<int64_t>() == env_steps);
  CHECK(s["episodes"].get<int64_t>() > 0);  // random CartPole episodes end within ~20 steps
  CHECK(s["mean_return"].get<double>() > 5.0);
  CHECK(s["mean_return"].get<double>() < 60.0);
  CHECK_FALSE(s.contains("epochs"));  // no dataset, no epochs
  CHECK_FALSE(s.contains("replicas"));

  // The coordinator wrote the strategy's progress lines and no epoch line.
  auto sample_lines = test::metrics_lines(dir, "sample");
  REQUIRE(sample_lines.size() == static_cast<std::size_t>(steps / 5));
  CHECK(sample_lines.back()["step"].get<int64_t>() == steps / 5 * 5);
  CHECK(sample_lines.back()["env_steps"].get<int64_t>() == steps / 5 * 5 * per_unroll);
  CHECK(test::metrics_lines(dir, "epoch").empty());
  CHECK(test::metrics_lines(dir, "summary").size() == 1);
  CHECK(reports.load() == static_cast<int>(sample_lines.size()));
  CHECK(last_measure.find("episodes") != std::string::npos);
  std::filesystem::remove_all(dir);
}
