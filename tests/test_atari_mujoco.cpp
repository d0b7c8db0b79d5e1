// Atari (ale-py) and MuJoCo through rl.env {"kind": "gymnasium"}: the
// Gymnasium wrappers by name, uint8 frames scaled to floats and read by the
// conv torso (envs/torso.hpp), and HalfCheetah's Box actions through the
// Gaussian head. The cases that need ale-py or mujoco skip where the venv
// (scripts/install-deps.sh) lacks them; the torso's own cases need no Python.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include "config/job_config.hpp"
#include "env_fixtures.hpp"
#include "envs/policy_head.hpp"
#include "envs/python_env.hpp"
#include "envs/torso.hpp"
#include "fixtures.hpp"
#include "models/policy_value.hpp"
#include "runtime/job.hpp"
#include "skip.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

gymnasium_env_config pong(const std::string& python, const std::string& wrappers) {
  gymnasium_env_config g;
  g.id = "ALE/Pong-v5";
  g.kwargs = R"({"frameskip": 1, "repeat_action_probability": 0.25})";
  g.wrappers = wrappers;
  g.python = python;
  return g;
}

envs::env_spec image_spec(std::vector<int64_t> shape) {
  envs::env_spec s;
  s.name = "Frames-v0";
  s.observation_shape = shape;
  s.observation_size = 1;
  for (auto d : shape) s.observation_size *= d;
  s.observation_dtype = "uint8";
  s.actions = 6;
  return s;
}

int64_t parameters(policy_value_model& net) {
  int64_t n = 0;
  for (auto& v : net.variables()) n += static_cast<int64_t>(v.value.numel());
  return n;
}

// A few updates of `example` with its environment shrunk to one actor of
// two instances, with rl.inference `inference`: the summary.
json few_updates(const std::string& example, const std::string& python, const std::string& out,
                 const std::string& inference = "local") {
  json j = json::parse(std::ifstream(std::string(TROUPE_SOURCE_DIR) + "/examples/" + example));
  j["rl"]["env"]["python"] = python;  // before the check, which starts it
  auto c = parse_job_config(j);
  c.logging.output_dir = out;
  c.logging.level = "warn";
  c.rl.inference = inference;
  c.rl.actors = 1;
  c.rl.envs_per_actor = 2;
  c.rl.unroll_length = 8;
  c.rl.batch_unrolls = 1;
  c.rl.queue_capacity = 2;
  c.training.target_return.reset();
  c.training.max_env_steps = 0;
  c.training.max_steps = 3;
  c.checkpoint.every_steps = 0;
  c.checkpoint.save_at_end = false;
  return run_job(c, {});
}

}  // namespace

TEST_CASE("torso: nature_cnn's layers, output and parameter count over [4,84,84] frames") {
  model_config mlp;
  mlp.kind = "policy_value_mlp";
  const auto spec = image_spec({4, 84, 84});
  const auto m = envs::rl_model_for(spec, mlp, "auto");  // an image: the conv torso
  REQUIRE(m.kind == "policy_value_layers");
  CHECK(m.layers[0] == json::parse(R"({"type": "reshape", "shape": [4, 84, 84]})"));
  auto net =
      create_policy_value_model(m, spec.observation_size, envs::policy_head_for(spec, "auto"), 1);
  // conv 4->32 8x8, 32->64 4x4, 64->64 3x3 (84 -> 20 -> 9 -> 7), dense
  // 64*7*7 -> 512, then the heads: 6 logits and a value over 512.
  const int64_t want = (32 * 4 * 64 + 32) + (64 * 32 * 16 + 64) + (64 * 64 * 9 + 64) +
                       (3136 * 512 + 512) + (512 * 6 + 6) + (512 + 1);
  CHECK(parameters(*net) == want);
  CHECK(net->variables()[6].value.shape() == shape_t{3136, 512});
  std::vector<float> obs(2 * 4 * 84 * 84, 0.5f), logits(2 * 6), values(2);
  net->forward(obs.data(), 2, logits.data(), values.data());
  for (float v : logits) CHECK(std::isfinite(v));
  // [H, W] frames get one channel.
  const auto gray = envs::rl_model_for(image_spec({84, 84}), mlp, "nature_cnn");
  CHECK(gray.layers[0]["shape"] == json::parse("[1, 84, 84]"));
}

TEST_CASE("torso: auto keeps the MLP for flat observations; nature_cnn refuses them by name") {
  model_config mlp;
  mlp.kind = "policy_value_mlp";
  const auto cartpole = envs::make_env("CartPole-v1", 1)->spec();
  CHECK(envs::rl_model_for(cartpole, mlp, "auto").kind == "policy_value_mlp");
  CHECK(envs::rl_model_for(image_spec({4, 84, 84}), mlp, "mlp").kind == "policy_value_mlp");
  CHECK_THROWS_WITH_AS(
      envs::rl_model_for(cartpole, mlp, "nature_cnn"),
      "rl.torso: 'CartPole-v1' has the observation space Box[4] float32, which the nature_cnn "
      "torso's first layer (conv2d_0: 32 filters, 8x8, stride 4) cannot take: it takes an "
      "image, [C,H,W] or [H,W], of at least 36x36 (\"mlp\" takes any observation, flattened)",
      config_error);
  CHECK_THROWS_WITH_AS(envs::rl_model_for(image_spec({1, 30, 84}), mlp, "nature_cnn"),
                       doctest::Contains("observation space Box[1,30,84] uint8"), config_error);
}

// A model.layers of one's own is kept under "auto", and checked against the
// environment's observations at the start.
TEST_CASE("torso: a policy_value_layers torso that does not fit is named with the observations") {
  json j = {{"strategy", {{"kind", "actor_learner"}}},
            {"model",
             {{"kind", "policy_value_layers"},
              {"layers", json::parse(R"([{"type": "reshape", "shape": [2, 3]},
                                         {"type": "flatten"}, {"type": "dense", "units": 8}])")}}},
            {"training", {{"max_steps", 1}}},
            {"rl", {{"env", "CartPole-v1"}}}};
  CHECK_THROWS_WITH_AS(parse_job_config(j),
                       "model.layers[0].shape: reshape cannot turn [4] (4 values) into [2,3] "
                       "(CartPole-v1's observations: 4 values)",
                       config_error);
}

TEST_CASE("gymnasium wrappers: an unknown one is refused naming it and its place") {
  const auto python = envs::testing::python_with("gymnasium");
  if (python.empty()) return test::skip_case("no Python with Gymnasium (scripts/install-deps.sh)");
  json j = {{"strategy", {{"kind", "actor_learner"}}},
            {"model", {{"kind", "policy_value_mlp"}}},
            {"training", {{"max_steps", 1}}},
            {"rl",
             {{"env",
               {{"kind", "gymnasium"},
                {"id", "CartPole-v1"},
                {"python", python},
                {"wrappers", {"time_limit:50", "frame_stak:4"}}}}}}};
  CHECK_THROWS_WITH_AS(
      parse_job_config(j),
      R"(rl.env.wrappers[1]: unknown wrapper 'frame_stak', expected one of "atari_preprocessing", )"
      R"("frame_stack", "grayscale", "resize", "clip_reward", "normalize_observation", )"
      R"("time_limit")",
      config_error);
  j["rl"]["env"]["wrappers"] = {{{"name", "time_limit"}, {"kwargs", {{"max_episode_steps", 7}}}}};
  CHECK(envs::job_env_spec(envs::env_choice_of(parse_job_config(j).rl)).max_episode_steps == 7);
}

TEST_CASE("atari: Pong's preprocessed frames reach the job as [4,84,84] uint8 scaled to [0,1]") {
  const auto python = envs::testing::python_with("gymnasium, ale_py, cv2");
  if (python.empty()) return test::skip_case("no Python with ale-py and OpenCV (install-deps)");
  auto env =
      envs::make_gymnasium_env(pong(python, R"(["atari_preprocessing", "frame_stack:4"])"), 2);
  const auto& spec = env->spec();
  CHECK(spec.observation_shape == std::vector<int64_t>{4, 84, 84});
  CHECK(spec.observation_dtype == "uint8");
  CHECK(spec.observation_size == 4 * 84 * 84);
  CHECK(spec.actions == 6);
  envs::testing::buffers out(*env);
  env->reset(5, out.obs.data());
  std::vector<int32_t> actions{2, 3};
  for (int step = 0; step < 6; ++step) env->step(actions.data(), out.out());
  int64_t lit = 0, off_grid = 0;
  for (float v : out.obs) {
    lit += v > 0;
    off_grid += v < 0 || v > 1 || std::abs(v * 255 - std::round(v * 255)) > 1e-3f;
  }
  CHECK(off_grid == 0);
  CHECK(lit > 4 * 84 * 84);  // the court is not black
  // The conv torso (rl.torso "nature_cnn") consumes them in a job: in the
  // actors and the learner, or in the inference server and the learner.
  for (const char* inference : {"local", "central"}) {
    CAPTURE(inference);
    test::temp_dir tmp;
    const auto s = few_updates("pong_impala.json", python, tmp / "run", inference);
    CHECK(s["updates"] == 3);
    CHECK(s["env_steps"].get<int64_t>() >= 3 * 8 * 2);
  }
}

TEST_CASE("atari: a wrapper that refuses the environment is named with Gymnasium's reason") {
  const auto python = envs::testing::python_with("gymnasium, ale_py, cv2");
  if (python.empty()) return test::skip_case("no Python with ale-py and OpenCV (install-deps)");
  auto g = pong(python, R"(["atari_preprocessing"])");
  g.kwargs = "{}";  // ALE's own frame skip of 4 under the wrapper's
  try {
    envs::make_gymnasium_env(g, 1);
    FAIL("no error");
  } catch (const envs::env_start_error& e) {
    CHECK(e.key() == "rl.env.wrappers[0]");
    CHECK(std::string(e.what()).starts_with(
        "the wrapper 'atari_preprocessing' refused the environment: "));
  }
}

// Gymnasium's HalfCheetah passes its action to MuJoCo as it is (MuJoCo
// clamps the control, the control cost counts the unclamped one); troupe
// clips a Box action to the bounds first, as every troupe environment does:
// 5.0 steps exactly as 1.0.
TEST_CASE("mujoco: HalfCheetah-v5 steps Box(6) actions, clipped to the Box") {
  const auto python = envs::testing::python_with("gymnasium, mujoco");
  if (python.empty()) return test::skip_case("no Python with MuJoCo (scripts/install-deps.sh)");
  gymnasium_env_config g;
  g.id = "HalfCheetah-v5";
  g.python = python;
  auto over = envs::make_gymnasium_env(g, 2), at = envs::make_gymnasium_env(g, 2);
  const auto& spec = over->spec();
  CHECK(spec.continuous());
  CHECK(spec.action_low == std::vector<float>(6, -1.0f));
  CHECK(spec.action_high == std::vector<float>(6, 1.0f));
  CHECK(spec.observation_size == 17);
  CHECK(spec.max_episode_steps == 1000);
  envs::testing::buffers a(*over), b(*at);
  over->reset(3, a.obs.data());
  at->reset(3, b.obs.data());
  std::vector<float> big(12), bound(12);
  for (int step = 0; step < 5; ++step) {
    for (std::size_t k = 0; k < 12; ++k) {
      big[k] = (k + step) % 2 ? 5.0f : -3.0f;
      bound[k] = (k + step) % 2 ? 1.0f : -1.0f;
    }
    over->step_box(big.data(), a.out());
    at->step_box(bound.data(), b.out());
    CHECK(a.reward == b.reward);
    CHECK(a.obs == b.obs);
  }
  CHECK(a.reward[0] != 0);
  // Through a job's Gaussian head.
  test::temp_dir tmp;
  const auto s = few_updates("halfcheetah_impala.json", python, tmp / "run");
  CHECK(s["updates"] == 3);
  CHECK(s["env"] == "HalfCheetah-v5");
}
