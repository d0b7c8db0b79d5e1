// Ape-X DQN end to end (rl.algorithm "apex_dqn"): the examples solve
// CartPole-v1 (mean return of the last 100 episodes >= 475) and Acrobot-v1
// (>= -100) through replay shards, and bad settings are refused naming the
// key.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "config/job_config.hpp"
#include "fixtures.hpp"
#include "policy_fixtures.hpp"
#include "runtime/job.hpp"

using namespace troupe;

namespace {

job_config example(const std::string& name, const std::string& out) {
  auto c = test::quiet_example_job(name, out);
  c.checkpoint.save_at_end = false;
  return c;
}

void check_solved(const nlohmann::json& s, double target) {
  CHECK(s["strategy"] == "actor_learner");
  CHECK(s["solved"] == true);
  CHECK(s["best_mean_return_100"].get<double>() >= target);
  CHECK(s["updates"].get<int64_t>() > 0);
  MESSAGE("solved in " << s["time_to_solve_seconds"] << " s, " << s["env_steps_to_solve"]
                       << " env steps, " << s["updates"] << " updates");
}

// The example's JSON, to be changed and parsed (parsing validates).
nlohmann::json example_json(const std::string& name) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/examples/" + name);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("apex_dqn: CartPole-v1 is solved through replay shards") {
  test::temp_dir tmp;
  check_solved(run_job(example("cartpole_apex.json", tmp / "run"), job_options{}), 475);
}

TEST_CASE("apex_dqn: Acrobot-v1 reaches a mean return of -100") {
  test::temp_dir tmp;
  check_solved(run_job(example("acrobot_apex.json", tmp / "run"), job_options{}), -100);
}

TEST_CASE("apex_dqn: bad settings are refused naming the key") {
  auto j = example_json("cartpole_apex.json");
  CHECK_NOTHROW(parse_job_config(j));
  j["rl"]["replay"]["min_size"] = 60000;  // capacity 50000
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("rl.replay.min_size"));
  j = example_json("cartpole_apex.json");
  j["rl"]["env"] = "Pendulum-v1";
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("rl.algorithm"));
  j = example_json("cartpole_apex.json");
  j["rl"]["algorithm"] = "dqn";
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("rl.algorithm"));
  j = example_json("cartpole_apex.json");
  j["rl"]["replay"]["beta"] = 1.5;
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("rl.replay.beta"));
  j = example_json("cartpole_apex.json");
  j["rl"]["replay"]["shard"] = 2;
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("rl.replay.shard"));
}
