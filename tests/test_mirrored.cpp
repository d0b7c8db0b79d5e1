// The mirrored strategy: N replicas with global batch B must train exactly
// what one replica with batch B trains, up to float rounding.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "actors/job.hpp"
#include "checkpoint/checkpoint.hpp"
#include "tests/fixtures.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

struct env_t {
  test::temp_dir tmp;
  std::string data = tmp / "data";
  int runs = 0;
  explicit env_t(int64_t train_n = 500) {
    spdlog::set_level(spdlog::level::warn);
    fs::create_directories(data);
    test::write_tiny_dataset(data, train_n, 100);
  }
  job_config job(const std::string& optimizer, int64_t replicas, int64_t batch) {
    auto c = test::tiny_job(data, tmp / ("run" + std::to_string(runs++)));
    c.optimizer.kind = optimizer;
    c.optimizer.learning_rate = optimizer == "sgd" ? 0.1 : 0.01;
    c.data.batch_size = batch;
    c.training.eval_every_epochs = 0;
    if (replicas > 0) {
      c.strategy.kind = "mirrored";
      c.strategy.replicas = replicas;
      c.devices.clear();
      for (int64_t r = 0; r < replicas; ++r) c.devices.push_back("cpu:" + std::to_string(r));
    }
    return c;
  }
};

std::vector<named_tensor> variables_of(const nlohmann::json& summary) {
  return checkpoint::load(summary["checkpoint"].get<std::string>()).variables;
}

// Largest absolute difference over all variables (names and shapes must match).
double max_abs_diff(const std::vector<named_tensor>& a, const std::vector<named_tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].name == b[i].name);
    REQUIRE(a[i].value.shape() == b[i].value.shape());
    auto x = a[i].value.span<float>();
    auto y = b[i].value.span<float>();
    for (std::size_t j = 0; j < x.size(); ++j)
      worst = std::max(worst, std::abs(double(x[j]) - double(y[j])));
  }
  return worst;
}

}  // namespace

// Tolerance: the replicas sum the same per-example gradients in another order
// (per-slice GEMMs, then the all-reduce), so parameters agree to float rounding,
// amplified a little by Adam's normalisation over the steps.
constexpr double kTolerance = 2e-5;

TEST_CASE("mirrored with N = 2, 3, 4 equals one_device at the same global batch (SGD, Adam)") {
  env_t env;
  for (std::string opt : {"sgd", "adam"}) {
    auto one = env.job(opt, 0, 48);
    one.training.max_steps = 12;
    auto ref = variables_of(run_job(one));
    for (int64_t n : {2, 3, 4}) {
      for (std::string algo : {"ring", "tree", "reduce_to_one"}) {
        for (bool sharded : {true, false}) {
          CAPTURE(opt);
          CAPTURE(n);
          CAPTURE(algo);
          CAPTURE(sharded);
          auto m = env.job(opt, n, 48);
          m.training.max_steps = 12;
          m.strategy.reducer.algorithm = algo;
          m.strategy.shard_optimizer = sharded;
          // Small buckets: the segments of a sharded update cross variables.
          m.strategy.reducer.bucket_bytes = 4096;
          m.strategy.check_replicas_every = 4;
          auto s = run_job(m);
          CHECK(s["strategy"] == "mirrored");
          CHECK(s["replicas"] == n);
          double d = max_abs_diff(ref, variables_of(s));
          MESSAGE("max |one_device - mirrored| = " << d);
          CHECK(d < kTolerance);
          // One step fewer moves the parameters far more than the tolerance,
          // so the comparison has teeth.
          m.training.max_steps = 11;
          m.logging.output_dir += "-short";
          CHECK(max_abs_diff(ref, variables_of(run_job(m))) > 100 * kTolerance);
        }
      }
    }
  }
}

TEST_CASE("gradient accumulation: N replicas x batch B x R steps equals one replica at B*R") {
  env_t env;
  for (std::string opt : {"sgd", "adam"}) {
    CAPTURE(opt);
    auto one = env.job(opt, 0, 48);
    one.training.max_steps = 8;
    auto ref = variables_of(run_job(one));

    auto acc1 = env.job(opt, 0, 16);
    acc1.strategy.steps_per_update = 3;
    acc1.training.max_steps = 8;
    CHECK(max_abs_diff(ref, variables_of(run_job(acc1))) < kTolerance);

    auto accn = env.job(opt, 2, 16);
    accn.strategy.steps_per_update = 3;
    accn.training.max_steps = 8;
    CHECK(max_abs_diff(ref, variables_of(run_job(accn))) < kTolerance);
  }
}

TEST_CASE("uneven input: a last batch smaller than N still trains every example once") {
  env_t env(50);  // batch 16 over 4 replicas: the 4th batch has 2 examples, 2 replicas get none
  auto one = env.job("sgd", 0, 16);
  auto mir = env.job("sgd", 4, 16);
  auto so = run_job(one);
  auto sm = run_job(mir);
  CHECK(sm["steps"] == 3 * 4);
  CHECK(sm["samples"] == 3 * 50);
  CHECK(max_abs_diff(variables_of(so), variables_of(sm)) < kTolerance);
}

TEST_CASE("checkpoints move between mirrored and one_device") {
  env_t env;
  auto full = env.job("adam", 0, 32);
  auto ref = variables_of(run_job(full));

  // The mirrored side updates sharded (ZeRO-1): its Adam slots are gathered
  // for the checkpoint, and a resume that lost half of them would not match.
  for (bool mirrored_first : {true, false}) {
    CAPTURE(mirrored_first);
    auto first = env.job("adam", mirrored_first ? 3 : 0, 32);
    auto second = env.job("adam", mirrored_first ? 0 : 3, 32);
    second.logging.output_dir = first.logging.output_dir;
    first.checkpoint.every_steps = 20;
    job_options die;
    die.fail_replica = 0;
    die.fail_at_step = 25;
    CHECK_THROWS_AS(run_job(first, die), job_error);
    job_options resume;
    resume.resume = true;
    auto s = run_job(second, resume);
    CHECK(s["strategy"] == (mirrored_first ? "one_device" : "mirrored"));
    CHECK(s["steps_this_run"] == 48 - 20);
    CHECK(max_abs_diff(ref, variables_of(s)) < kTolerance);
  }
}

TEST_CASE("a failing mirrored replica ends the job within 1 s, naming it") {
  env_t env;
  auto c = env.job("sgd", 4, 32);
  job_options o;
  o.fail_replica = 2;
  o.fail_at_step = 3;
  auto t0 = std::chrono::steady_clock::now();
  try {
    run_job(c, o);
    FAIL("the job should have failed");
  } catch (const job_error& e) {
    std::string w = e.what();
    CHECK(w.find("replica 2 (cpu:2)") != std::string::npos);
    CHECK(w.find("injected failure at step 3") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
}
