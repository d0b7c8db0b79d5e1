// Gymnasium environments (Python) through rl.env {"kind": "gymnasium"}:
// the config's shape, then (with a Python that has Gymnasium:
// $TROUPE_GYM_PYTHON, else the venv scripts/install-deps.sh makes, else the
// cases skip) Gymnasium's CartPole-v1 against the built-in one step for step,
// the errors of bad input, and a user's own gymnasium.Env subclass, from a
// module outside the repository, trained to its optimal return.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "config/job_config.hpp"
#include "env_fixtures.hpp"
#include "envs/python_env.hpp"
#include "fixtures.hpp"
#include "models/random.hpp"
#include "policy_fixtures.hpp"
#include "runtime/job.hpp"
#include "skip.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

// The user's module: a corridor with a known optimal return (right four
// times: -0.1 * 3 + 1 = 0.7), and environments that misbehave.
constexpr const char* kUserModule = R"py(
import os, signal
import gymnasium as gym
import numpy as np

class Corridor(gym.Env):
    def __init__(self, length=5):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
    def _obs(self):
        o = np.zeros(self.length, np.float32)
        o[self.pos] = 1
        return o
    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}
    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos == self.length - 1
        return self._obs(), 1.0 if done else -0.1, done, False, {}

class Raises(Corridor):
    def step(self, action):
        raise ValueError("the corridor caved in")

class Dies(Corridor):
    def step(self, action):
        os.kill(os.getpid(), signal.SIGKILL)

class Pairs(Corridor):
    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.MultiDiscrete([2, 2])
)py";

// The Python with Gymnasium, or "" when this host has none.
std::string gymnasium_python() {
  return envs::testing::python_with("gymnasium");
}

// The user's module in a directory of its own, on PYTHONPATH (which the
// workers inherit).
struct user_module {
  test::temp_dir dir;
  user_module() {
    std::ofstream(dir / "troupe_user_envs.py") << kUserModule;
    const char* old = std::getenv("PYTHONPATH");
    setenv("PYTHONPATH", (dir.str() + (old ? ":" + std::string(old) : "")).c_str(), 1);
  }
};

gymnasium_env_config user_env(const std::string& python, const std::string& cls) {
  gymnasium_env_config g;
  g.id = cls + "-v0";
  g.entry_point = "troupe_user_envs:" + cls;
  g.kwargs = R"({"max_episode_steps": 20})";
  g.python = python;
  return g;
}

std::string start_error(const gymnasium_env_config& g, std::string& key) {
  try {
    envs::make_gymnasium_env(g, 2);
  } catch (const envs::env_start_error& e) {
    key = e.key();
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("gymnasium config: rl.env as an object, its keys named") {
  // Refused while reading, before any Python starts.
  auto parse = [](const std::string& env) {
    json j = {{"strategy", {{"kind", "actor_learner"}}},
              {"model", {{"kind", "policy_value_mlp"}}},
              {"training", {{"max_steps", 1}}},
              {"rl", {{"env", json::parse(env)}}}};
    try {
      parse_job_config(j);
    } catch (const config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(parse(R"({"kind": "gym", "id": "X-v0"})") ==
        R"(rl.env.kind: expected one of "gymnasium", "plugin", got "gym")");
  CHECK(parse(R"({"kind": "gymnasium"})") == "rl.env.id: missing: expected a Gymnasium id");
  CHECK(parse(R"({"id": "X-v0"})") == R"(rl.env.kind: missing: expected "gymnasium" or "plugin")");
  CHECK(parse(R"({"kind": "gymnasium", "id": "X-v0", "kwargs": [1]})") ==
        "rl.env.kwargs: expected an object (gymnasium.make's keyword arguments), got [1]");
  CHECK(parse(R"({"kind": "gymnasium", "id": "X-v0", "entry_point": "mod.Class"})") ==
        R"(rl.env.entry_point: expected "package.module:Class", got "mod.Class")");
  CHECK(parse(R"({"kind": "gymnasium", "id": "X-v0", "pyhton": "python3"})") ==
        R"(rl.env.pyhton: unknown key; did you mean "python"?)");
}

TEST_CASE("gymnasium config: a missing Python is named at the job's start") {
  json j = {
      {"strategy", {{"kind", "actor_learner"}}},
      {"model", {{"kind", "policy_value_mlp"}}},
      {"training", {{"max_steps", 1}}},
      {"rl",
       {{"env", {{"kind", "gymnasium"}, {"id", "CartPole-v1"}, {"python", "/no/such/python3"}}}}}};
  CHECK_THROWS_WITH_AS(parse_job_config(j),
                       "rl.env.python: cannot run '/no/such/python3': No such file or directory",
                       config_error);
}

// Gymnasium seeds its reset from NumPy's generator and the built-in
// CartPole from splitmix64, so the start states differ: every episode the
// Python one starts is copied into the built-in one (set_state), and from
// there both step the same actions. A balancing policy on half the
// instances reaches the time limit (truncation), random actions on the
// other half end episodes early (termination).
TEST_CASE("gymnasium: CartPole-v1 steps as the built-in CartPole-v1 from the same states") {
  const auto python = gymnasium_python();
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  gymnasium_env_config g;
  g.id = "CartPole-v1";
  g.python = python;
  constexpr int64_t M = 4, O = 4;
  auto gym = envs::make_gymnasium_env(g, M);
  auto builtin = envs::make_env("CartPole-v1", M);
  REQUIRE(gym->spec().observation_size == O);
  REQUIRE(gym->spec().actions == 2);
  REQUIRE(gym->spec().max_episode_steps == 500);
  REQUIRE(gym->state_size() == builtin->state_size());
  envs::testing::buffers a(*gym), b(*builtin);
  gym->reset(7, a.obs.data());
  builtin->reset(7, b.obs.data());
  auto copy_state = [&](int64_t i) {
    double s[4];
    gym->get_state(i, s);
    builtin->set_state(i, s);
  };
  for (int64_t i = 0; i < M; ++i) copy_state(i);
  splitmix64 rng(3);
  std::vector<int32_t> actions(M);
  int64_t terminations = 0, truncations = 0;
  for (int step = 0; step < 1200; ++step) {
    for (int64_t i = 0; i < M; ++i) {
      const float* o = a.obs.data() + i * O;  // x, x_dot, theta, theta_dot
      const bool balance = 0.1f * o[0] + 0.5f * o[1] + 3 * o[2] + o[3] > 0;
      actions[static_cast<std::size_t>(i)] =
          i < 2 ? (balance ? 1 : 0) : static_cast<int32_t>(rng.uniform() * 2);
    }
    gym->step(actions.data(), a.out());
    builtin->step(actions.data(), b.out());
    for (int64_t i = 0; i < M; ++i) {
      const auto k = static_cast<std::size_t>(i);
      CAPTURE(step);
      CAPTURE(i);
      REQUIRE(a.reward[k] == b.reward[k]);
      REQUIRE(a.terminated[k] == b.terminated[k]);
      REQUIRE(a.truncated[k] == b.truncated[k]);
      const bool ended = a.terminated[k] || a.truncated[k];
      for (int64_t d = 0; d < O; ++d) {
        const auto at = static_cast<std::size_t>(i * O + d);
        REQUIRE((ended ? a.final_obs[at] == b.final_obs[at] : a.obs[at] == b.obs[at]));
      }
      if (!ended) continue;
      REQUIRE(a.ret[k] == b.ret[k]);
      REQUIRE(a.len[k] == b.len[k]);
      terminations += a.terminated[k];
      truncations += a.truncated[k];
      copy_state(i);
    }
  }
  CHECK(terminations > 10);
  CHECK(truncations >= 2);
}

TEST_CASE("gymnasium: bad input is refused naming the key and the cause") {
  const auto python = gymnasium_python();
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  user_module module;
  std::string key;
  gymnasium_env_config unknown;
  unknown.id = "NoSuchEnv-v0";
  unknown.python = python;
  CHECK(start_error(unknown, key) ==
        "Gymnasium cannot make 'NoSuchEnv-v0': gymnasium.error.NameNotFound: Environment "
        "`NoSuchEnv` doesn't exist.");
  CHECK(key == "rl.env.id");
  CHECK(start_error(user_env(python, "Pairs"), key) ==
        "'Pairs-v0' has the action space MultiDiscrete([2 2]), which no policy head takes: the "
        "softmax head takes Discrete(n), the gaussian one a one-dimensional Box of floats");
  CHECK(key == "rl.env");
  gymnasium_env_config frozen_lake;
  frozen_lake.id = "FrozenLake-v1";
  frozen_lake.python = python;
  CHECK(start_error(frozen_lake, key) ==
        "'FrozenLake-v1' has the observation space Discrete(16), which the policy/value model's "
        "input layer cannot take: it takes a Box of floats or of uint8 pixels");
  CHECK(key == "rl.env");
  auto missing_class = user_env(python, "Missing");
  CHECK(start_error(missing_class, key) ==
        "Gymnasium cannot make 'Missing-v0' from 'troupe_user_envs:Missing': AttributeError: "
        "module 'troupe_user_envs' has no attribute 'Missing'");
  CHECK(key == "rl.env.entry_point");
}

// A Python without Gymnasium, made by shadowing the package on PYTHONPATH.
TEST_CASE("gymnasium: a Python without Gymnasium is named at the start") {
  const auto python = gymnasium_python();
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  test::temp_dir dir;
  std::filesystem::create_directories(dir.path / "gymnasium");
  std::ofstream(dir / "gymnasium/__init__.py")
      << "raise ModuleNotFoundError(\"No module named 'gymnasium'\")\n";
  const char* old = std::getenv("PYTHONPATH");
  const std::string kept = old ? old : "";
  setenv("PYTHONPATH", dir.str().c_str(), 1);
  gymnasium_env_config g;
  g.id = "CartPole-v1";
  g.python = python;
  std::string key;
  const auto message = start_error(g, key);
  setenv("PYTHONPATH", kept.c_str(), 1);
  CHECK(message == "'" + python +
                       "' cannot import Gymnasium (ModuleNotFoundError: No module named "
                       "'gymnasium'): install it into that Python (scripts/install-deps.sh makes "
                       "a venv with it) or name another in rl.env.python");
  CHECK(key == "rl.env.python");
}

TEST_CASE("gymnasium: an exception in step names the env and its last traceback line") {
  const auto python = gymnasium_python();
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  user_module module;
  auto env = envs::make_gymnasium_env(user_env(python, "Raises"), 2);
  envs::testing::buffers out(*env);
  env->reset(1, out.obs.data());
  std::vector<int32_t> actions{1, 0};
  CHECK_THROWS_WITH_AS(env->step(actions.data(), out.out()),
                       "Raises-v0 (Gymnasium): step raised ValueError: the corridor caved in",
                       std::runtime_error);
}

job_config corridor_job(const std::string& out, const gymnasium_env_config& g) {
  auto c = test::quiet_example_job("cartpole_impala.json", out);
  c.rl.env = g.id;
  c.rl.gymnasium = g;
  c.rl.actors = 1;
  c.rl.envs_per_actor = 8;
  c.training.target_return = 0.65;
  c.training.max_env_steps = 400000;
  return c;
}

TEST_CASE("gymnasium: a dead worker process ends the job with its cause") {
  const auto python = gymnasium_python();
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  user_module module;
  test::temp_dir tmp;
  auto c = corridor_job(tmp / "run", user_env(python, "Dies"));
  CHECK_THROWS_WITH_AS(run_job(c, {}),
                       doctest::Contains("Dies-v0'"
                                         ": the Gymnasium worker process (rl.env.python) was "
                                         "killed by signal 9"),
                       job_error);
}

// The corridor's optimal return is 0.7 (four steps right); a mean of the
// last 100 episodes of 0.65 or more needs nearly every episode optimal.
TEST_CASE("gymnasium: a user's gymnasium.Env from outside the repository trains to its optimum") {
  const auto python = gymnasium_python();
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  user_module module;
  test::temp_dir tmp;
  auto c = corridor_job(tmp / "run", user_env(python, "Corridor"));
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 0.65);
  CHECK(s["mean_return_100"].get<double>() <= 0.7 + 1e-9);
  CHECK(s["env"] == "Corridor-v0");
}

// Other processes of a job read the config the chief writes (to_json).
TEST_CASE("gymnasium: rl.env survives the config's round trip to other processes") {
  const auto python = gymnasium_python();
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  json env = {{"kind", "gymnasium"},
              {"id", "CartPole-v1"},
              {"kwargs", {{"max_episode_steps", 100}}},
              {"python", python}};
  json j = {{"strategy", {{"kind", "actor_learner"}}},
            {"model", {{"kind", "policy_value_mlp"}}},
            {"training", {{"max_steps", 1}}},
            {"rl", {{"env", env}}}};
  const auto first = parse_job_config(j);
  CHECK(to_json(first)["rl"]["env"] == env);
  const auto again = parse_job_config(to_json(first));
  REQUIRE(again.rl.gymnasium);
  CHECK(again.rl.env == "CartPole-v1");
  CHECK(again.rl.gymnasium->kwargs == R"({"max_episode_steps":100})");
  CHECK(again.rl.gymnasium->python == python);
  CHECK(envs::job_env_spec(envs::env_choice_of(again.rl)).max_episode_steps == 100);
}
