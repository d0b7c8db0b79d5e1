// Actor/learner RL on a discrete device (models/device_policy.hpp), on
// sim:N: the policy's forward and backward against the host's, bit for bit;
// what a device cannot run; an IMPALA job whose learner computes on sim:0,
// and a central inference server whose forward does.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "devices/device_context.hpp"
#include "envs/env.hpp"
#include "envs/policy_head.hpp"
#include "fixtures.hpp"
#include "kernels/cpu_kernels.hpp"
#include "models/device_policy.hpp"
#include "policy_fixtures.hpp"
#include "runtime/job.hpp"

using namespace troupe;
using troupe::test::quiet_example_job;
using troupe::test::random_floats;
using troupe::test::tiny_model;

namespace {

policy_head head_of_env(const std::string& env) {
  return envs::policy_head_for(envs::make_env(env, 1)->spec(), "auto");
}

std::vector<float> values_of(const std::vector<named_tensor>& ts) {
  std::vector<float> out;
  for (const auto& t : ts) out.insert(out.end(), t.value.f32(), t.value.f32() + t.value.numel());
  return out;
}

// The same policy on the host and on sim:0 (same seed): outputs, values and
// gradients of two backward passes (the second accumulating) are equal, and
// a change of the host variables reaches the device at the next forward.
void check_device_matches_host(const std::string& env, int64_t O) {
  kernels::init_cpu_kernels();
  const auto head = head_of_env(env);
  auto host = create_policy_value_model(tiny_model(), O, head, 3);
  auto dev =
      create_policy_value_model_on(discrete_device_context("sim:0"), tiny_model(), O, head, 3);
  REQUIRE(values_of(dev->variables()) == values_of(host->variables()));
  const int64_t rows = 7, P = head.outputs();
  const auto obs = random_floats(static_cast<std::size_t>(rows * O), 4, 1.0);
  const auto dout = random_floats(static_cast<std::size_t>(rows * P), 5, 1.0);
  const auto dval = random_floats(static_cast<std::size_t>(rows), 6, 1.0);
  auto gh = host->make_gradients(), gd = dev->make_gradients();
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    std::vector<float> out_h(static_cast<std::size_t>(rows * P)), val_h(rows);
    std::vector<float> out_d(out_h.size(), -1.0f), val_d(rows, -1.0f);
    host->forward(obs.data(), rows, out_h.data(), val_h.data());
    dev->forward(obs.data(), rows, out_d.data(), val_d.data());
    CHECK(out_d == out_h);
    CHECK(val_d == val_h);
    host->backward(obs.data(), rows, dout.data(), dval.data(), gh, round > 0);
    dev->backward(obs.data(), rows, dout.data(), dval.data(), gd, round > 0);
    CHECK(values_of(gd) == values_of(gh));
    // An optimizer step on the host variables (as the learner's).
    for (auto* net : {host.get(), dev.get()})
      for (auto& v : net->variables())
        for (int64_t i = 0; i < v.value.numel(); ++i) v.value.f32()[i] *= 0.75f;
  }
}

}  // namespace

TEST_CASE("device policy: forward and backward on sim:0 are the host's, bit for bit") {
  SUBCASE("CartPole, softmax") {
    check_device_matches_host("CartPole-v1", 4);
  }
  SUBCASE("Pendulum, Gaussian") {
    check_device_matches_host("Pendulum-v1", 3);
  }
}

TEST_CASE("device policy: a model kind a device cannot run is named; cpu:N is the host's") {
  kernels::init_cpu_kernels();
  auto layers = tiny_model();
  layers.kind = "policy_value_layers";
  layers.layers = nlohmann::json::parse(R"([{"type": "dense", "units": 8}, {"type": "tanh"}])");
  CHECK_THROWS_WITH(create_policy_value_model_on(discrete_device_context("sim:0"), layers, 4,
                                                 head_of_env("CartPole-v1"), 1),
                    "a policy on sim:0 runs model.kind \"policy_value_mlp\", got "
                    "\"policy_value_layers\"");
  CHECK(discrete_device_context("cpu:0") == nullptr);
  CHECK(discrete_device_context("inference_server") == nullptr);  // a thread's label
  auto host = create_policy_value_model_on(nullptr, layers, 4, head_of_env("CartPole-v1"), 1);
  CHECK(host->variables().size() == 6);
  // A job says so at validation, naming the device.
  auto j = nlohmann::json::parse(R"({"strategy": {"kind": "actor_learner"},
      "model": {"kind": "policy_value_layers", "layers": [{"type": "dense", "units": 8}]},
      "devices": ["cpu:0", "sim:0"], "training": {"max_env_steps": 1000}})");
  CHECK_THROWS_WITH_AS(parse_job_config(j),
                       "devices[1]: a learner on sim:0 runs model.kind \"policy_value_mlp\", "
                       "got \"policy_value_layers\"",
                       config_error);
}

TEST_CASE("actor_learner: a learner on sim:0 solves CartPole, the actors on the host") {
  test::temp_dir tmp;
  auto c = quiet_example_job("cartpole_impala.json", tmp / "run");
  c.devices = {"sim:0", "cpu:1"};
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
}

TEST_CASE("actor_learner: central inference and the learner both on sim:0 solve CartPole") {
  test::temp_dir tmp;
  auto c = quiet_example_job("cartpole_impala.json", tmp / "run");
  c.devices = {"sim:0", "cpu:1"};
  c.rl.inference = "central";
  c.rl.central.device = "sim:0";
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["inference_batches"].get<int64_t>() > 0);
}
