// Layer models (model.kind "layers") under the strategies: a convnet with
// synchronised batch norm and dropout trains the same under mirrored as
// under one_device, its checkpoints (running statistics included) move
// between strategies and between cpu and sim devices, and the asynchronous
// strategies train it.
#include <doctest/doctest.h>

#include "actors/fault_injection.hpp"
#include "checkpoint/checkpoint.hpp"
#include "runtime/job.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

using env_t = test::strategy_env;
using test::max_abs_diff;

// The tiny data set's 8x8 images as [1,8,8]: conv, batch norm, pooling,
// dropout, a residual block.
void convnet(job_config& c) {
  c.model.kind = "layers";
  c.model.layers = json::parse(R"([
    {"type": "reshape", "shape": [1, 8, 8]},
    {"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same", "use_bias": false},
    {"type": "batch_norm"}, {"type": "relu"},
    {"type": "residual", "layers": [
      {"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"}, {"type": "relu"}]},
    {"type": "max_pool2d", "size": 2},
    {"type": "flatten"}, {"type": "dropout", "rate": 0.2},
    {"type": "dense", "units": 10}])");
}

job_config job(env_t& env, const std::string& kind, int64_t n, int64_t batch) {
  auto c = env.job(kind, "adam", n, batch);
  convnet(c);
  return c;
}

std::vector<named_tensor> state_of(const json& summary) {
  return checkpoint::load(summary["checkpoint"].get<std::string>()).state;
}

// Batch norm makes each step's update depend on every example of the batch,
// and Adam normalises: a little more rounding than the MLP's 2e-5.
constexpr double kTolerance = 1e-4;

}  // namespace

TEST_CASE("a convnet with synced batch norm and dropout: mirrored = one_device") {
  env_t env(300);
  auto one = job(env, "", 0, 48);
  one.training.max_steps = 10;
  auto s1 = run_job(one);
  auto ref = test::variables_of(s1);
  auto ref_state = state_of(s1);
  REQUIRE(ref_state.size() == 2);  // the running mean and variance
  for (int64_t n : {2, 3}) {
    for (std::string algo : {"ring", "device"}) {
      CAPTURE(n);
      CAPTURE(algo);
      auto m = job(env, "mirrored", n, 48);
      m.training.max_steps = 10;
      m.strategy.reducer.algorithm = parse_reducer_algorithm(algo);
      auto s = run_job(m);
      double d = max_abs_diff(ref, test::variables_of(s));
      MESSAGE("max |one_device - mirrored| = " << d);
      CHECK(d < kTolerance);
      CHECK(max_abs_diff(ref_state, state_of(s)) < kTolerance);
    }
  }
  // Teeth: per-replica statistics, or another step, are far off.
  auto per_replica = job(env, "mirrored", 2, 48);
  per_replica.training.max_steps = 10;
  per_replica.model.layers[2]["sync"] = false;
  CHECK(max_abs_diff(ref, test::variables_of(run_job(per_replica))) > 10 * kTolerance);
  auto shorter = job(env, "", 0, 48);
  shorter.training.max_steps = 9;
  CHECK(max_abs_diff(ref, test::variables_of(run_job(shorter))) > 10 * kTolerance);
}

TEST_CASE("a layer model's checkpoint moves between strategies and between cpu and sim") {
  env_t env(300);
  auto full = job(env, "", 0, 32);
  auto ref = test::variables_of(run_job(full));
  struct move {
    std::string first, second;
    std::string first_device, second_device;
  };
  for (const auto& mv :
       {move{"", "mirrored", "sim:0", "cpu:0"}, move{"mirrored", "", "cpu:0", "sim:0"}}) {
    CAPTURE(mv.first);
    CAPTURE(mv.first_device);
    auto first = job(env, mv.first, mv.first.empty() ? 0 : 2, 32);
    auto second = job(env, mv.second, mv.second.empty() ? 0 : 2, 32);
    for (auto* c : {&first, &second}) {
      const auto& dev = c == &first ? mv.first_device : mv.second_device;
      const auto kind = dev.substr(0, dev.find(':'));
      for (std::size_t i = 0; i < c->devices.size(); ++i)
        c->devices[i] = kind + ":" + std::to_string(i);
      if (c->devices.empty()) c->devices = {dev};
    }
    second.logging.output_dir = first.logging.output_dir;
    first.checkpoint.every_steps = 12;
    job_options die;
    die.faults = inject_faults(fault_injection{}.fail_replica_at(0, 15));
    CHECK_THROWS_AS(run_job(first, die), job_error);
    job_options resume;
    resume.resume = true;
    auto s = run_job(second, resume);
    CHECK(s["steps_this_run"] == 30 - 12);  // 3 epochs of 10 batches
    CHECK(max_abs_diff(ref, test::variables_of(s)) < kTolerance);
  }
}

TEST_CASE("parameter_server and elastic_average train a layer model; its statistics are saved") {
  env_t env(300);
  for (std::string kind : {"parameter_server", "elastic_average", "central_storage"}) {
    CAPTURE(kind);
    auto c = job(env, kind, 2, 32);
    // EASGD's center, an elastic average of the workers, learns slower.
    c.training.epochs = kind == "elastic_average" ? 10 : 4;
    c.training.eval_every_epochs = c.training.epochs;
    auto s = run_job(c);
    MESSAGE("test accuracy " << s["test_accuracy"]);
    // 10 classes: chance is 0.1. EASGD evaluates its center with the first
    // worker's batch-norm statistics, which belong to that worker's own
    // variables: it lags (0.5 after 10 epochs here, 0.76 train accuracy).
    CHECK(s["test_accuracy"].get<double>() > (kind == "elastic_average" ? 0.3 : 0.5));
    auto state = state_of(s);
    REQUIRE(state.size() == 2);
    CHECK(state[0].name == "batch_norm_0/moving_mean");
    // The running mean moved away from its initial zeros.
    double moved = 0;
    for (float v : state[0].value.span<float>()) moved += std::abs(v);
    CHECK(moved > 0);
  }
}
