// Variables on shards: central_storage trains what mirrored trains;
// parameter_server workers step on their own within the staleness bound,
// survive lost workers, admit late ones; checkpoints hold whole variables
// whatever the placement.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "actors/fault_injection.hpp"
#include "checkpoint/checkpoint.hpp"
#include "runtime/job.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

using test::max_abs_diff;
using test::metrics_of;
using test::variables_of;
using env_t = test::strategy_env;

// Same tolerance as the mirrored tests: the same gradients summed in another order.
constexpr double kTolerance = 2e-5;

}  // namespace

TEST_CASE("central_storage equals mirrored (and one_device) after K steps, any placement") {
  env_t env(480);
  for (std::string opt : {"sgd", "adam"}) {
    auto one = env.job("", opt, 1, 48);
    one.training.max_steps = 10;
    auto ref = variables_of(run_job(one));
    auto mir = env.job("mirrored", opt, 3, 48);
    mir.training.max_steps = 10;
    auto mirrored = variables_of(run_job(mir));
    CHECK(max_abs_diff(ref, mirrored) < kTolerance);
    for (int64_t shards : {1, 2, 3}) {
      for (std::string part : {"round_robin", "fixed_shards"}) {
        CAPTURE(opt);
        CAPTURE(shards);
        CAPTURE(part);
        auto c = env.job("central_storage", opt, 3, 48);
        c.training.max_steps = 10;
        c.strategy.shards = shards;
        c.strategy.partitioner.kind = part;
        auto s = run_job(c);
        CHECK(s["strategy"] == "central_storage");
        CHECK(s["steps"] == 10);
        double d = max_abs_diff(mirrored, variables_of(s));
        MESSAGE("max |mirrored - central_storage| = " << d);
        CHECK(d < kTolerance);
      }
    }
    // One step fewer is far outside the tolerance: the comparison has teeth.
    auto shorter = env.job("central_storage", opt, 3, 48);
    shorter.training.max_steps = 9;
    CHECK(max_abs_diff(mirrored, variables_of(run_job(shorter))) > 100 * kTolerance);
  }
}

TEST_CASE("split variables round-trip through checkpoints across strategies") {
  env_t env(480);
  auto full = env.job("", "adam", 1, 32);
  auto ref = variables_of(run_job(full));  // 45 steps
  for (bool shards_first : {true, false}) {
    CAPTURE(shards_first);
    auto sharded = env.job("central_storage", "adam", 2, 32);
    sharded.strategy.shards = 2;
    sharded.strategy.partitioner.kind = "fixed_shards";  // every variable split in two
    auto plain = env.job("", "adam", 1, 32);
    auto& first = shards_first ? sharded : plain;
    auto& second = shards_first ? plain : sharded;
    second.logging.output_dir = first.logging.output_dir;
    first.checkpoint.every_steps = 20;
    job_options die;
    die.faults = inject_faults(fault_injection{}.fail_replica_at(0, 25));
    CHECK_THROWS_AS(run_job(first, die), job_error);
    // The checkpoint holds whole variables by name, with whole Adam slots.
    auto snap = checkpoint::load(*checkpoint::resolve(first.logging.output_dir + "/checkpoints"));
    CHECK(snap.meta.step == 20);
    REQUIRE(snap.variables.size() == ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) {
      CHECK(snap.variables[i].name == ref[i].name);
      CHECK(snap.variables[i].value.shape() == ref[i].value.shape());
    }
    int adam_slots = 0;
    for (const auto& t : snap.slots) adam_slots += t.name.find("/adam_") != std::string::npos;
    CHECK(adam_slots == 2 * static_cast<int>(ref.size()));
    job_options resume;
    resume.resume = true;
    auto s = run_job(second, resume);
    CHECK(s["steps_this_run"] == 45 - 20);
    CHECK(max_abs_diff(ref, variables_of(s)) < kTolerance);
  }
}

// Replays the order in which pushes finished: when worker w finishes its step
// c, every other worker had finished at least c - k steps (it was issued only
// then), so nobody ran more than k + 1 steps ahead of anyone.
void check_staleness_bound(const nlohmann::json& summary, int64_t workers, int64_t k) {
  auto pushes = metrics_of(summary, "push");
  REQUIRE(!pushes.empty());
  std::vector<int64_t> clock(static_cast<std::size_t>(workers), 0);
  int64_t worst = 0;
  for (const auto& p : pushes) {
    auto w = p["worker"].get<std::size_t>();
    int64_t c = p["worker_step"].get<int64_t>();
    CHECK(c == clock[w]);  // each worker's steps in order
    clock[w] = c + 1;
    for (auto other : clock) worst = std::max(worst, clock[w] - other);
  }
  MESSAGE("largest lead: " << worst << " steps (bound " << k << ")");
  CHECK(worst <= k + 1);
}

TEST_CASE("parameter_server: max_staleness 0 is bulk-synchronous, k bounds the lead") {
  env_t env(480);
  for (int64_t k : {0, 2}) {
    CAPTURE(k);
    auto c = env.job("parameter_server", "sgd", 3, 16);
    c.strategy.shards = 2;
    c.strategy.max_staleness = k;
    c.training.epochs = 2;
    auto s = run_job(c);
    CHECK(s["steps"] == 2 * 3 * 10);  // 480 examples / (16 * 3) = 10 rounds per epoch
    check_staleness_bound(s, 3, k);
    CHECK(s.contains("staleness_mean"));
  }
  // Without a bound the summary still reports staleness measured at the shards.
  auto c = env.job("parameter_server", "sgd", 3, 16);
  c.strategy.shards = 2;
  auto s = run_job(c);
  CHECK(s["staleness_max"].get<int64_t>() >= 0);
}

TEST_CASE("parameter_server: a lost worker is logged and the others finish the job") {
  env_t env(480);
  auto c = env.job("parameter_server", "adam", 4, 16);
  c.strategy.shards = 2;
  job_options o;
  // worker 2's fifth step
  o.faults = inject_faults(fault_injection{}.fail_replica_at(2, 4));
  auto s = run_job(c, o);
  CHECK(s["steps"] == 3 * 4 * 8);  // all updates done, counted at the shards: 8 rounds of 64
  auto lost = metrics_of(s, "worker_lost");
  REQUIRE(lost.size() == 1);
  CHECK(lost[0]["worker"] == 2);
  CHECK(lost[0]["cause"].get<std::string>().find("injected failure") != std::string::npos);
  CHECK(lost[0]["workers_left"] == 3);
  for (const auto& p : metrics_of(s, "push"))
    if (p["worker"] == 2) CHECK(p["worker_step"].get<int64_t>() < 4);
}

TEST_CASE("parameter_server: a late worker joins from the current variables and contributes") {
  env_t env(480);
  auto c = env.job("parameter_server", "adam", 3, 16);
  c.strategy.shards = 2;
  c.strategy.max_staleness = 1;
  job_options o;
  o.faults = inject_faults(fault_injection{}.join_late_at(2, 15));
  auto s = run_job(c, o);
  auto joined = metrics_of(s, "worker_joined");
  REQUIRE(joined.size() == 1);
  CHECK(joined[0]["worker"] == 2);
  CHECK(joined[0]["step"].get<int64_t>() >= 15);
  int64_t late_pushes = 0, seen = 0, first_seen_at = -1;
  for (const auto& p : metrics_of(s, "push")) {
    ++seen;
    if (p["worker"] == 2 && first_seen_at < 0) first_seen_at = seen;
    late_pushes += p["worker"] == 2;
  }
  CHECK(first_seen_at > 15);
  CHECK(late_pushes > 5);
  CHECK(s["steps"] == 3 * 3 * 10);
}

TEST_CASE("losing a variable shard ends the job naming it; the checkpoint resumes it") {
  env_t env(480);
  for (std::string kind : {"central_storage", "parameter_server"}) {
    CAPTURE(kind);
    auto c = env.job(kind, "sgd", 2, 16);
    c.strategy.shards = 2;
    c.checkpoint.every_steps = 10;
    job_options o;
    o.faults = inject_faults(fault_injection{}.fail_shard_at(1, 13));
    try {
      run_job(c, o);
      FAIL("the job should fail");
    } catch (const job_error& e) {
      std::string what = e.what();
      CHECK(what.find("variable_shard 1") != std::string::npos);
      CHECK(what.find("injected failure") != std::string::npos);
    }
    job_options resume;
    resume.resume = true;
    auto s = run_job(c, resume);
    CHECK(s["steps_this_run"].get<int64_t>() == s["steps"].get<int64_t>() - 10);
  }
}

TEST_CASE("parameter_server on Fashion-MNIST: a worker lost mid-job, still >= 0.89") {
  test::temp_dir tmp;
  auto job = test::fashion_mnist_job("ps_lost_worker", tmp / "out", 10);
  if (!job) return;
  auto& c = *job;
  c.data.batch_size = 64;
  c.strategy.kind = "parameter_server";
  c.strategy.shards = 2;
  c.strategy.max_staleness = 4;
  job_options o;
  o.faults = inject_faults(fault_injection{}.fail_replica_at(1, 300));
  auto s = run_job(c, o);
  MESSAGE("test accuracy " << s["test_accuracy"] << " after losing worker 1");
  CHECK(s["test_accuracy"].get<double>() >= 0.89);
  REQUIRE(metrics_of(s, "worker_lost").size() == 1);
}
