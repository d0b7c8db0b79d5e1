// Native environment plugins through rl.env {"kind": "plugin"}: the example
// plugin (examples/plugins/classic_plugin.cpp) steps bit for bit as the
// built-in CartPole-v1, trains to the optimum of its Corridor-v0 in a whole
// job, survives the config's round trip to other processes; bad input (a
// missing library, a library that is no plugin, another ABI version,
// spaces no policy head takes, a failing step, kwargs that are no object)
// is refused naming the key and the cause (tests/plugins/broken_plugin.cpp).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "config/job_config.hpp"
#include "env_fixtures.hpp"
#include "envs/plugin_env.hpp"
#include "envs/python_env.hpp"
#include "fixtures.hpp"
#include "models/random.hpp"
#include "runtime/job.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

constexpr const char* kExample = "libtroupe_classic_plugin.so";
constexpr const char* kBroken = "libtroupe_test_plugin_misbehaving.so";

plugin_env_config plugin(const std::string& library, const std::string& id,
                         const std::string& kwargs = "{}") {
  return {library, id, kwargs};
}

// The message of the env_start_error making `p` throws, and its key.
std::string start_error(const plugin_env_config& p, std::string& key) {
  try {
    envs::make_plugin_env(p, 2);
  } catch (const envs::env_start_error& e) {
    key = e.key();
    return e.what();
  }
  return "no error";
}

std::string library_path(const std::string& name) {
  return envs::plugin_library_path(name);
}

}  // namespace

// Both start from splitmix64 streams (seed, i) and step the same doubles:
// every output of every step is equal, through terminations (random
// actions) and truncations (a balancing policy reaches the time limit).
TEST_CASE("env plugin: CartPole-v1 steps bit for bit as the built-in CartPole-v1") {
  constexpr int64_t M = 4, O = 4;
  auto native = envs::make_plugin_env(plugin(kExample, "CartPole-v1"), M);
  auto builtin = envs::make_env("CartPole-v1", M);
  REQUIRE(native->spec().name == "CartPole-v1");
  REQUIRE(native->spec().observation_size == O);
  REQUIRE(native->spec().actions == 2);
  REQUIRE(native->spec().max_episode_steps == 500);
  REQUIRE(native->state_size() == 4);
  envs::testing::buffers a(*native), b(*builtin);
  native->reset(7, a.obs.data());
  builtin->reset(7, b.obs.data());
  REQUIRE(a.obs == b.obs);
  splitmix64 rng(3);
  std::vector<int32_t> actions(M);
  int64_t terminations = 0, truncations = 0;
  for (int step = 0; step < 1500; ++step) {
    for (int64_t i = 0; i < M; ++i) {
      const float* o = a.obs.data() + i * O;  // x, x_dot, theta, theta_dot
      const bool balance = 0.1f * o[0] + 0.5f * o[1] + 3 * o[2] + o[3] > 0;
      actions[static_cast<std::size_t>(i)] =
          i < 2 ? (balance ? 1 : 0) : static_cast<int32_t>(rng.uniform() * 2);
    }
    native->step(actions.data(), a.out());
    builtin->step(actions.data(), b.out());
    CAPTURE(step);
    REQUIRE(a.obs == b.obs);
    REQUIRE(a.reward == b.reward);
    REQUIRE(a.terminated == b.terminated);
    REQUIRE(a.truncated == b.truncated);
    REQUIRE(a.ret == b.ret);
    REQUIRE(a.len == b.len);
    for (int64_t i = 0; i < M; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (!a.terminated[k] && !a.truncated[k]) continue;
      for (int64_t d = 0; d < O; ++d)
        REQUIRE(a.final_obs[static_cast<std::size_t>(i * O + d)] ==
                b.final_obs[static_cast<std::size_t>(i * O + d)]);
      terminations += a.terminated[k];
      truncations += a.truncated[k];
    }
  }
  CHECK(terminations > 10);
  CHECK(truncations >= 2);
  double s[4], t[4];
  native->get_state(1, s);
  builtin->get_state(1, t);
  CHECK(std::equal(s, s + 4, t));
  // Bad actions are refused before the plugin sees them, as for a built-in.
  actions[2] = 2;
  CHECK_THROWS_WITH_AS(native->step(actions.data(), a.out()),
                       "CartPole-v1: instance 2: action 2 is out of range [0, 2)",
                       std::invalid_argument);
}

TEST_CASE("env plugin: kwargs reach the plugin, and what it refuses is named") {
  auto short_episodes =
      envs::make_plugin_env(plugin(kExample, "CartPole-v1", R"({"max_episode_steps":7})"), 1);
  CHECK(short_episodes->spec().max_episode_steps == 7);
  auto corridor = envs::make_plugin_env(plugin(kExample, "Corridor-v0", R"({"length":9})"), 3);
  CHECK(corridor->spec().observation_size == 9);
  CHECK(corridor->state_size() == 0);
  double state[1];
  CHECK_THROWS_WITH_AS(
      corridor->get_state(0, state),
      "Corridor-v0: no state of instance 0 of 3 (the plugin has no get_state/set_state)",
      std::out_of_range);
  std::string key;
  CHECK(start_error(plugin(kExample, "CartPole-v1", R"({"lenght":3})"), key) ==
        "the plugin 'libtroupe_classic_plugin.so' cannot make 'CartPole-v1' with kwargs "
        R"({"lenght":3}: unknown keyword argument 'lenght' for CartPole-v1)");
  CHECK(key == "rl.env");
  CHECK(start_error(plugin(kExample, "Pong-v5"), key) ==
        "the plugin 'libtroupe_classic_plugin.so' cannot make 'Pong-v5' with kwargs {}: no "
        "environment 'Pong-v5' here (this plugin makes CartPole-v1 and Corridor-v0)");
  CHECK(key == "rl.env");
}

TEST_CASE("env plugin: a library that cannot be used is refused naming rl.env.library") {
  std::string key;
  CHECK(start_error(plugin("libno_such_plugin.so", "X-v0"), key) ==
        "cannot load the plugin 'libno_such_plugin.so': libno_such_plugin.so: cannot open shared "
        "object file: No such file or directory");
  CHECK(key == "rl.env.library");
  const auto no_entry = library_path("libtroupe_test_plugin_no_entry.so");
  CHECK(start_error(plugin(no_entry, "X-v0"), key) ==
        "'" + no_entry +
            "' exports no function troupe_env_plugin: it is not a troupe environment plugin "
            "(envs/troupe_env_plugin.h)");
  CHECK(key == "rl.env.library");
  const auto old_abi = library_path("libtroupe_test_plugin_abi_99.so");
  CHECK(start_error(plugin(old_abi, "FailingStep-v0"), key) ==
        "'" + old_abi +
            "' was built for plugin ABI version 99, this troupe takes version 1: rebuild it "
            "against this troupe's envs/troupe_env_plugin.h");
  CHECK(key == "rl.env.library");
}

TEST_CASE("env plugin: spaces no model or policy head takes are refused naming them") {
  std::string key;
  CHECK(start_error(plugin(kBroken, "Pairs-v0"), key) ==
        "'Pairs-v0' has the action space MultiDiscrete(2 parts), which no policy head takes: the "
        "softmax head takes Discrete(n), the gaussian one a Box of floats");
  CHECK(key == "rl.env");
  CHECK(start_error(plugin(kBroken, "Bytes-v0"), key) ==
        "'Bytes-v0' has observations of dtype 2, which the policy/value model's input layer "
        "cannot take: it takes a Box of float32 (TROUPE_DTYPE_FLOAT32)");
  CHECK(start_error(plugin(kBroken, "Unbounded-v0"), key) ==
        "'Unbounded-v0' has a Box action space whose dimension 0 is [-1, inf]: expected finite "
        "bounds, low <= high");
}

TEST_CASE("env plugin: a failing step names the environment and the plugin's message") {
  auto env = envs::make_plugin_env(plugin(kBroken, "FailingStep-v0"), 2);
  envs::testing::buffers out(*env);
  env->reset(1, out.obs.data());
  std::vector<int32_t> actions{1, 0};
  env->step(actions.data(), out.out());
  env->step(actions.data(), out.out());
  CHECK_THROWS_WITH_AS(env->step(actions.data(), out.out()),
                       "FailingStep-v0 (plugin 'libtroupe_test_plugin_misbehaving.so'): step "
                       "failed: the pole snapped at step 3",
                       std::runtime_error);
}

namespace {

json plugin_job_json(const json& env) {
  return {{"strategy", {{"kind", "actor_learner"}}},
          {"model", {{"kind", "policy_value_mlp"}}},
          {"training", {{"max_steps", 1}}},
          {"rl", {{"env", env}}}};
}

std::string parse_error(const json& env) {
  try {
    parse_job_config(plugin_job_json(env));
  } catch (const config_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("env plugin config: the keys named, and the plugin's errors at the job's start") {
  CHECK(parse_error({{"kind", "plugin"}, {"id", "X-v0"}}) ==
        "rl.env.library: missing: expected the plugin's shared library (.so)");
  CHECK(parse_error({{"kind", "plugin"}, {"library", kExample}}) ==
        "rl.env.id: missing: expected the id of an environment the plugin makes");
  CHECK(parse_error({{"kind", "plugin"}, {"library", kExample}, {"id", "X"}, {"kwargs", "{}"}}) ==
        R"(rl.env.kwargs: expected an object (the plugin's keyword arguments), got "{}")");
  CHECK(parse_error({{"kind", "plugni"}, {"library", kExample}, {"id", "X"}}) ==
        R"(rl.env.kind: expected one of "gymnasium", "plugin", got "plugni")");
  CHECK(parse_error({{"kind", "plugin"}, {"library", kExample}, {"id", "X"}, {"python", "p"}}) ==
        R"(rl.env.python: unknown key (expected one of: "kind", "library", "id", "kwargs"))");
  CHECK(parse_error({{"kind", "plugin"}, {"library", "libno_such_plugin.so"}, {"id", "X"}}) ==
        "rl.env.library: cannot load the plugin 'libno_such_plugin.so': libno_such_plugin.so: "
        "cannot open shared object file: No such file or directory");
  CHECK(parse_error({{"kind", "plugin"}, {"library", kBroken}, {"id", "Pairs-v0"}}) ==
        "rl.env: 'Pairs-v0' has the action space MultiDiscrete(2 parts), which no policy head "
        "takes: the softmax head takes Discrete(n), the gaussian one a Box of floats");
}

// Other processes of a job read the config the chief writes (to_json).
TEST_CASE("env plugin config: rl.env survives the round trip to other processes") {
  json env = {{"kind", "plugin"},
              {"library", library_path(kExample)},
              {"id", "CartPole-v1"},
              {"kwargs", {{"max_episode_steps", 100}}}};
  const auto first = parse_job_config(plugin_job_json(env));
  CHECK(to_json(first)["rl"]["env"] == env);
  const auto again = parse_job_config(to_json(first));
  REQUIRE(again.rl.plugin);
  CHECK(!again.rl.gymnasium);
  CHECK(again.rl.env == "CartPole-v1");
  CHECK(again.rl.plugin->kwargs == R"({"max_episode_steps":100})");
  CHECK(envs::job_env_spec(envs::env_choice_of(again.rl)).max_episode_steps == 100);
}

// A relative library next to the config file is that file, from any
// working directory; the example's is found in the build's plugin dir.
TEST_CASE("env plugin config: a relative library is resolved against the config file's dir") {
  test::temp_dir dir;
  std::filesystem::copy_file(library_path(kExample), dir / "libmyenv.so");
  auto j = plugin_job_json({{"kind", "plugin"}, {"library", "libmyenv.so"}, {"id", "Corridor-v0"}});
  std::ofstream(dir / "job.json") << j.dump();
  const auto c = load_job_config(dir / "job.json");
  REQUIRE(c.rl.plugin);
  CHECK(c.rl.plugin->library == (dir.path / "libmyenv.so").string());
  const auto example =
      load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_plugin.json");
  REQUIRE(example.rl.plugin);
  CHECK(example.rl.plugin->library == kExample);
  CHECK(library_path(kExample) == std::string(TROUPE_PLUGIN_DIR) + "/" + kExample);
}

TEST_CASE("env plugin: examples/cartpole_plugin.json solves CartPole-v1 through the plugin") {
  test::temp_dir tmp;
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_plugin.json");
  c.logging.output_dir = tmp / "run";
  c.logging.level = "warn";
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["mean_return_100"].get<double>() <= 500);
  CHECK(s["env"] == "CartPole-v1");
}

// The corridor's optimal return is 0.7 (four steps right); a mean of the
// last 100 episodes of 0.65 or more needs nearly every episode optimal.
TEST_CASE("env plugin: an actor_learner job trains the plugin's Corridor-v0 to its optimum") {
  test::temp_dir tmp;
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_plugin.json");
  c.logging.output_dir = tmp / "run";
  c.logging.level = "warn";
  c.rl.plugin->id = c.rl.env = "Corridor-v0";
  c.rl.plugin->kwargs = R"({"length":5,"max_episode_steps":20})";
  c.rl.actors = 1;
  c.rl.envs_per_actor = 8;
  c.training.target_return = 0.65;
  c.training.max_env_steps = 400000;
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 0.65);
  CHECK(s["mean_return_100"].get<double>() <= 0.7 + 1e-6);
  CHECK(s["env"] == "Corridor-v0");
}
