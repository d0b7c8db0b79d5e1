// The mirrored strategy: N replicas with global batch B must train exactly
// what one replica with batch B trains, up to float rounding.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "actors/fault_injection.hpp"
#include "checkpoint/checkpoint.hpp"
#include "runtime/job.hpp"
#include "runtime/topology.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

using test::max_abs_diff;
using test::variables_of;
using env_t = test::strategy_env;

// A mirrored job with n replicas; n = 0: one_device.
job_config job(env_t& env, const std::string& optimizer, int64_t n, int64_t batch) {
  return env.job(n > 0 ? "mirrored" : "", optimizer, n, batch);
}

}  // namespace

// Tolerance: the replicas sum the same per-example gradients in another order
// (per-slice GEMMs, then the all-reduce), so parameters agree to float rounding,
// amplified a little by Adam's normalisation over the steps.
constexpr double kTolerance = 2e-5;

TEST_CASE("mirrored with N = 2, 3, 4 equals one_device at the same global batch (SGD, Adam)") {
  env_t env(500);
  for (std::string opt : {"sgd", "adam"}) {
    auto one = job(env, opt, 0, 48);
    one.training.max_steps = 12;
    auto ref = variables_of(run_job(one));
    for (int64_t n : {2, 3, 4}) {
      for (std::string algo : {"ring", "tree", "reduce_to_one"}) {
        for (bool sharded : {true, false}) {
          CAPTURE(opt);
          CAPTURE(n);
          CAPTURE(algo);
          CAPTURE(sharded);
          auto m = job(env, opt, n, 48);
          m.training.max_steps = 12;
          m.strategy.reducer.algorithm = parse_reducer_algorithm(algo);
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

TEST_CASE("batches gathered on the devices train exactly what the pipelines' gathers train") {
  env_t env(500);
  auto run = [&](const std::string& gather, int64_t n, const std::string& reducer = "ring") {
    auto m = job(env, "adam", n, 48);
    m.training.max_steps = 10;
    m.data.gather = gather;
    m.strategy.reducer.algorithm = parse_reducer_algorithm(reducer);
    m.logging.output_dir += "-" + gather + std::to_string(n) + reducer;
    return variables_of(run_job(m));
  };
  for (int64_t n : {2, 3}) {
    CAPTURE(n);
    auto on_pipelines = run("pipeline", n);
    // The same batches, so the same arithmetic: bit-identical parameters.
    CHECK(max_abs_diff(on_pipelines, run("device", n)) == 0.0);
    CHECK(max_abs_diff(on_pipelines, run("auto", n)) == 0.0);
    CHECK(max_abs_diff(on_pipelines, run("step", n)) == 0.0);
    // With the device collectives, "auto" copies the rows in the step.
    auto collectives = run("pipeline", n, "device");
    CHECK(max_abs_diff(collectives, run("auto", n, "device")) == 0.0);
    CHECK(max_abs_diff(collectives, run("step", n, "device")) == 0.0);
  }
  // 4 replicas on 2 device threads: two pipelines gather on each device.
  auto shared = job(env, "adam", 4, 48);
  shared.training.max_steps = 10;
  shared.devices = {"cpu:0", "cpu:1", "cpu:0", "cpu:1"};
  auto ref = variables_of(run_job(shared));
  shared.data.gather = "device";
  shared.logging.output_dir += "-device";
  CHECK(max_abs_diff(ref, variables_of(run_job(shared))) == 0.0);
}

TEST_CASE("data.gather auto: on the devices when a synchronous job's devices take every core") {
  const auto cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> every_core, one = {"cpu:0"}, one_twice = {"cpu:0", "cpu:0"};
  for (unsigned i = 0; i < cores; ++i) every_core.push_back("cpu:" + std::to_string(i));
  const auto on_device = [](const std::string& gather, bool lockstep,
                            const std::vector<std::string>& devices, bool collectives = false) {
    return gather_place_for(gather, lockstep, devices, collectives) == gather_place::device;
  };
  CHECK(on_device("auto", true, every_core));
  CHECK_FALSE(on_device("auto", false, every_core));  // asynchronous workers
  CHECK(on_device("auto", true, one) == (cores == 1));
  CHECK(on_device("auto", true, one_twice) == (cores == 1));  // one thread
  CHECK(on_device("device", false, one));
  CHECK(gather_place_for("pipeline", true, every_core) == gather_place::pipeline);
  CHECK(gather_place_for("auto", false, one) == gather_place::pipeline);
  // A step with its collectives inside never leaves the device idle: on host
  // devices it copies its own rows; a discrete device's thread leaves them to
  // the pipeline.
  CHECK(gather_place_for("auto", true, every_core, true) == gather_place::step);
  CHECK(gather_place_for("auto", true, {"sim:0", "sim:1"}, true) == gather_place::pipeline);
  CHECK(on_device("device", true, every_core, true));
  CHECK(gather_place_for("step", false, one) == gather_place::step);
}

TEST_CASE("gradient accumulation: N replicas x batch B x R steps equals one replica at B*R") {
  env_t env(500);
  for (std::string opt : {"sgd", "adam"}) {
    CAPTURE(opt);
    auto one = job(env, opt, 0, 48);
    one.training.max_steps = 8;
    auto ref = variables_of(run_job(one));

    auto acc1 = job(env, opt, 0, 16);
    acc1.strategy.steps_per_update = 3;
    acc1.training.max_steps = 8;
    CHECK(max_abs_diff(ref, variables_of(run_job(acc1))) < kTolerance);

    auto accn = job(env, opt, 2, 16);
    accn.strategy.steps_per_update = 3;
    accn.training.max_steps = 8;
    CHECK(max_abs_diff(ref, variables_of(run_job(accn))) < kTolerance);
  }
}

TEST_CASE("uneven input: a last batch smaller than N still trains every example once") {
  env_t env(50);  // batch 16 over 4 replicas: the 4th batch has 2 examples, 2 replicas get none
  auto one = job(env, "sgd", 0, 16);
  auto mir = job(env, "sgd", 4, 16);
  auto so = run_job(one);
  auto sm = run_job(mir);
  CHECK(sm["steps"] == 3 * 4);
  CHECK(sm["samples"] == 3 * 50);
  CHECK(max_abs_diff(variables_of(so), variables_of(sm)) < kTolerance);
}

TEST_CASE("checkpoints move between mirrored and one_device") {
  env_t env(500);
  auto full = job(env, "adam", 0, 32);
  auto ref = variables_of(run_job(full));

  // The mirrored side updates sharded (ZeRO-1), through the reducer actors
  // (ring, 3 replicas) or inside its device collectives (nccl, 2 replicas:
  // on cpu devices, variables the replicas divide): its Adam slots are
  // gathered for the checkpoint, and a resume that lost part of them would
  // not match.
  for (const std::string algorithm : {"ring", "device"})
    for (bool mirrored_first : {true, false}) {
      CAPTURE(algorithm);
      CAPTURE(mirrored_first);
      const int64_t n = algorithm == "device" ? 2 : 3;
      auto first = job(env, "adam", mirrored_first ? n : 0, 32);
      auto second = job(env, "adam", mirrored_first ? 0 : n, 32);
      first.strategy.reducer.algorithm = second.strategy.reducer.algorithm =
          parse_reducer_algorithm(algorithm);
      first.logging.output_dir += "-" + algorithm;
      second.logging.output_dir = first.logging.output_dir;
      first.checkpoint.every_steps = 20;
      job_options die;
      die.faults = inject_faults(fault_injection{}.fail_replica_at(0, 25));
      CHECK_THROWS_AS(run_job(first, die), job_error);
      job_options resume;
      resume.resume = true;
      auto s = run_job(second, resume);
      CHECK(s["strategy"] == (mirrored_first ? "one_device" : "mirrored"));
      CHECK(s["steps_this_run"] == 48 - 20);
      CHECK(max_abs_diff(ref, variables_of(s)) < kTolerance);
    }
}

TEST_CASE("a failing mirrored replica ends the job, naming it") {
  env_t env(500);
  auto c = job(env, "sgd", 4, 32);
  job_options o;
  o.faults = inject_faults(fault_injection{}.fail_replica_at(2, 3));
  auto t0 = std::chrono::steady_clock::now();
  try {
    run_job(c, o);
    FAIL("the job should have failed");
  } catch (const job_error& e) {
    std::string w = e.what();
    CAPTURE(w);
    CHECK(w.find("replica 2 (cpu:2)") != std::string::npos);
    CHECK(w.find("injected failure at step 3") != std::string::npos);
  }
  // A hang guard: the job ends on the failure, not on its 500 examples' end.
  const auto took = std::chrono::steady_clock::now() - t0;
  MESSAGE("the job ended " << std::chrono::duration<double>(took).count() << " s after it started");
  CHECK(took < test::kHangGuard);
}

// training.steps_per_execution hands the replicas several steps per request;
// a step that is device work alone (one_device, mirrored on the device
// collectives) runs them as one device task, any other one by one. The
// arithmetic is the same step by step: bit-identical parameters, the same
// metrics lines, and executions cut at every boundary (epoch ends, a
// checkpoint every 5 steps, the last partial execution).
TEST_CASE("steps_per_execution trains exactly what one step per request trains") {
  env_t env(500);  // 11 steps an epoch at batch 48
  struct setup {
    const char* kind;
    int64_t n;
    const char* algo;
    bool sharded;
  };
  for (auto [kind, n, algo, sharded] :
       {setup{"", 0, "ring", true}, setup{"mirrored", 2, "device", true},
        setup{"mirrored", 3, "device", false}, setup{"mirrored", 2, "ring", true},
        setup{"central_storage", 2, "ring", true}}) {
    CAPTURE(kind);
    CAPTURE(n);
    CAPTURE(algo);
    auto run = [&](int64_t per_execution) {
      auto c = env.job(kind, "adam", n, 48);
      c.training.epochs = 2;
      c.training.steps_per_execution = per_execution;
      c.strategy.reducer.algorithm = parse_reducer_algorithm(algo);
      c.strategy.shard_optimizer = sharded;
      c.checkpoint.every_steps = 5;
      c.logging.every_steps = 1;
      return run_job(c);
    };
    auto one = run(1);
    for (int64_t k : {int64_t{4}, int64_t{64}, training_config::kAutoSteps}) {
      CAPTURE(k);
      auto s = run(k);
      CHECK(s["steps"] == one["steps"]);
      CHECK(s["samples"] == 1000);
      CHECK(max_abs_diff(variables_of(one), variables_of(s)) == 0.0);
      auto a = test::metrics_of(one, "step"), b = test::metrics_of(s, "step");
      REQUIRE(a.size() == 22);
      REQUIRE(b.size() == a.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        CHECK(b[i]["step"] == a[i]["step"]);
        CHECK(b[i]["loss"] == a[i]["loss"]);
      }
    }
  }
}

// "auto": sized from the time per step, ~4 ms an execution. The tiny model's
// steps take well under 100 µs (under the sanitizers too), so the driver
// soon hands out more than one at a time: fewer executions than steps. The
// last size is not asserted: a stall of the loaded machine near the end
// (ctest runs tests side by side) can bring it back to 1.
TEST_CASE("steps_per_execution auto hands out several steps at a time when steps are short") {
  env_t env(2000);
  auto c = env.job("mirrored", "adam", 2, 16);
  c.model.hidden = {8};
  c.strategy.reducer.algorithm = reducer_algorithm::device;
  c.training.epochs = 2;
  c.training.steps_per_execution = training_config::kAutoSteps;
  auto s = run_job(c);
  CHECK(s["steps"] == 250);
  // Only where the steps were short: a sanitizer build on a loaded machine
  // can take more than the ~4 ms an execution aims at for each step alone.
  const double step_ms =
      1000.0 * static_cast<double>(c.data.batch_size) / s["samples_per_second"].get<double>();
  if (step_ms < 2.0)
    CHECK(s["executions"].get<int64_t>() < 250);
  else
    MESSAGE("steps took " << step_ms << " ms each here: not short, executions not checked");
  CHECK(s["steps_per_execution"].get<int64_t>() >= 1);
  CHECK(s["steps_per_execution"].get<int64_t>() <= 64);
  c.training.steps_per_execution = 1;
  c.logging.output_dir += "-one";
  auto one = run_job(c);
  CHECK(one["steps_per_execution"] == 1);
  CHECK(one["executions"] == 250);
  CHECK(max_abs_diff(variables_of(one), variables_of(s)) == 0.0);
}
