// Integration tests: real jobs through the actors, on a tiny generated dataset.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>

#include "actors/failure.hpp"
#include "actors/fault_injection.hpp"
#include "checkpoint/checkpoint.hpp"
#include "data/idx.hpp"
#include "data/npy.hpp"
#include "devices/device.hpp"
#include "runtime/checkpointing.hpp"
#include "runtime/job.hpp"
#include "runtime/preemption.hpp"
#include "runtime/topology.hpp"
#include "tests/fixtures.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

struct tiny_env {
  test::temp_dir tmp;
  std::string data = tmp / "data";
  tiny_env() {
    spdlog::set_level(spdlog::level::warn);
    fs::create_directories(data);
    test::write_tiny_dataset(data, 500, 200);
  }
  job_config job(const std::string& out) { return test::tiny_job(data, tmp / out); }
};

std::vector<named_tensor> final_variables(const std::string& out) {
  auto dir = checkpoint::resolve(out + "/checkpoints");
  REQUIRE(dir.has_value());
  return checkpoint::load(*dir).variables;
}

}  // namespace

TEST_CASE("one_device job trains, writes metrics, summary and checkpoint") {
  tiny_env env;
  auto c = env.job("run");
  auto s = run_job(c);
  CHECK(s["strategy"] == "one_device");
  CHECK(s["steps"] == 3 * 16);  // ceil(500/32) = 16 steps per epoch
  CHECK(s["epochs"].get<double>() == doctest::Approx(3.0));
  CHECK(s["test_accuracy"].get<double>() > 0.9);
  CHECK(s["samples_per_second"].get<double>() > 0);
  CHECK(s.contains("test_loss"));
  CHECK(s.contains("wall_seconds"));
  CHECK(fs::exists(env.tmp / "run/summary.json"));
  // Every step of every epoch was trained on the whole set: 3 * 500 samples.
  CHECK(s["samples"] == 1500);
  // metrics.jsonl: JSON lines with step and epoch records.
  std::ifstream m(env.tmp / "run/metrics.jsonl");
  int steps = 0, epochs = 0;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") ++steps;
    if (j["type"] == "epoch") {
      ++epochs;
      CHECK(j.contains("test_accuracy"));
      CHECK(j.contains("train_loss"));
    }
  }
  CHECK(epochs == 3);
  CHECK(steps >= 9);
  auto vars = final_variables(env.tmp / "run");
  REQUIRE(vars.size() == 4);
  CHECK(vars[0].name == "dense_0/kernel");
  CHECK(vars[0].value.shape() == shape_t{64, 16});
}

TEST_CASE("a job reads npz, npy and csv data (data.format)") {
  tiny_env env;
  // The tiny IDX set as NumPy files: uint8 examples [N, 1, 8, 8], int64 labels.
  auto arrays = [&](const std::string& prefix) {
    auto x = data::read_idx(env.data + "/" + prefix + "-images-idx3-ubyte.gz");
    auto y = data::read_idx(env.data + "/" + prefix + "-labels-idx1-ubyte.gz");
    std::vector<int64_t> labels(y.bytes.begin(), y.bytes.end());
    std::vector<int64_t> dims = {x.dims[0], 1, x.dims[1], x.dims[2]};
    return std::pair{data::npy_bytes(data::npy_dtype::u1, dims, x.bytes.data(), x.bytes.size()),
                     data::npy_bytes(data::npy_dtype::i8, {y.dims[0]}, labels.data(),
                                     labels.size() * sizeof(int64_t))};
  };
  const auto [x_train, y_train] = arrays("train");
  const auto [x_test, y_test] = arrays("t10k");
  const auto idx = run_job(env.job("idx"));

  auto npz = env.job("npz");
  npz.data.format = "npz";
  npz.data.train.file = env.tmp / "train.npz";
  npz.data.test.file = env.tmp / "test.npz";
  data::write_file(npz.data.train.file,
                   data::zip_bytes({{"x.npy", x_train}, {"y.npy", y_train}}, true));
  data::write_file(npz.data.test.file,
                   data::zip_bytes({{"x.npy", x_test}, {"y.npy", y_test}}, false));
  const auto s = run_job(npz);
  // The same examples, scaled and normalized alike: the same run, bit for bit.
  CHECK(s["test_accuracy"] == idx["test_accuracy"]);
  CHECK(s["test_loss"] == idx["test_loss"]);
  const auto a = final_variables(env.tmp / "idx"), b = final_variables(env.tmp / "npz");
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].value == b[i].value);

  auto npy = env.job("npy");
  npy.data.format = "npy";
  npy.data.train = {"", env.tmp / "x_train.npy", env.tmp / "y_train.npy"};
  npy.data.test = {"", env.tmp / "x_test.npy", env.tmp / "y_test.npy"};
  data::write_file(npy.data.train.x, x_train);
  data::write_file(npy.data.train.y, y_train);
  data::write_file(npy.data.test.x, x_test);
  data::write_file(npy.data.test.y, y_test);
  CHECK(run_job(npy)["test_accuracy"] == idx["test_accuracy"]);

  // The same examples as a CSV table of pixel values, standardized.
  auto csv = env.job("csv");
  csv.data.format = "csv";
  csv.data.label = "class";
  csv.data.standardize = true;
  for (const auto& [prefix, file] : {std::pair{std::string("train"), std::string("train.csv")},
                                     std::pair{std::string("t10k"), std::string("test.csv")}}) {
    auto x = data::read_idx(env.data + "/" + prefix + "-images-idx3-ubyte.gz");
    auto y = data::read_idx(env.data + "/" + prefix + "-labels-idx1-ubyte.gz");
    // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive)
    // on "," + std::to_string(...).
    std::string text = "class";
    for (int p = 0; p < 64; ++p) {
      text += ",p";
      text += std::to_string(p);
    }
    text += '\n';
    for (int64_t i = 0; i < y.dims[0]; ++i) {
      text += 'c';
      text += std::to_string(y.bytes[static_cast<std::size_t>(i)]);
      for (int p = 0; p < 64; ++p) {
        text += ',';
        text += std::to_string(x.bytes[static_cast<std::size_t>(i * 64 + p)]);
      }
      text += '\n';
    }
    (prefix == "train" ? csv.data.train : csv.data.test).file = env.tmp / file;
    data::write_file(env.tmp / file, text);
  }
  CHECK(run_job(csv)["test_accuracy"].get<double>() > 0.9);

  // Float targets: a classifier's loss needs whole numbers, and says so;
  // a regression (mse) trains on them.
  // The target: the class / 10 (the images show their class).
  for (const auto& [prefix, file] : {std::pair{std::string("train"), npy.data.train.y},
                                     std::pair{std::string("t10k"), npy.data.test.y}}) {
    auto y = data::read_idx(env.data + "/" + prefix + "-labels-idx1-ubyte.gz");
    std::vector<float> targets;
    for (auto c : y.bytes) targets.push_back(0.1f * static_cast<float>(c));
    data::write_file(file, data::npy_bytes(data::npy_dtype::f4, {y.dims[0]}, targets.data(),
                                           targets.size() * sizeof(float)));
  }
  try {
    run_job(npy);
    FAIL("expected a job_error");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).starts_with("data: "));
    CHECK(std::string(e.what()).ends_with(
        "(model.loss is softmax_cross_entropy, which needs integer class labels)"));
  }
  npy.model.kind = "layers";
  npy.model.loss = "mse";
  npy.model.layers = nlohmann::json::parse(
      R"([{"type": "flatten"}, {"type": "dense", "units": 16}, {"type": "relu"},
          {"type": "dense", "units": 1}])");
  npy.training.epochs = 1;
  npy.logging.output_dir += "-mse-1";
  const double after_one = run_job(npy)["test_loss"].get<double>();
  npy.training.epochs = 6;
  npy.logging.output_dir += "-mse-6";
  const double after_six = run_job(npy)["test_loss"].get<double>();
  CHECK(after_six < after_one);
  CHECK(after_six < 0.06);  // the mean target everywhere scores the variance, 0.0825
}

TEST_CASE("same seed gives identical parameters; another seed does not") {
  tiny_env env;
  auto a = env.job("a");
  auto b = env.job("b");
  auto c = env.job("c");
  c.seed = 4;
  run_job(a);
  run_job(b);
  run_job(c);
  auto va = final_variables(env.tmp / "a");
  auto vb = final_variables(env.tmp / "b");
  auto vc = final_variables(env.tmp / "c");
  for (std::size_t i = 0; i < va.size(); ++i) CHECK(va[i].value == vb[i].value);
  CHECK_FALSE(va[0].value == vc[0].value);
}

TEST_CASE("interrupted job resumed from its checkpoint equals the uninterrupted run") {
  tiny_env env;
  auto full = env.job("full");
  full.checkpoint.every_steps = 10;
  run_job(full);

  auto part = env.job("part");
  part.checkpoint.every_steps = 10;
  job_options fail;
  // dies after the checkpoint at step 20
  fail.faults = inject_faults(fault_injection{}.fail_replica_at(0, 27));
  CHECK_THROWS_WITH_AS(run_job(part, fail), doctest::Contains("injected failure at step 27"),
                       job_error);
  auto latest = checkpoint::resolve(env.tmp / "part/checkpoints");
  REQUIRE(latest.has_value());
  CHECK(checkpoint::load(*latest).meta.step == 20);

  job_options resume;
  resume.resume = true;
  auto s = run_job(part, resume);
  CHECK(s["steps"] == 48);
  CHECK(s["steps_this_run"] == 28);
  auto vf = final_variables(env.tmp / "full");
  auto vp = final_variables(env.tmp / "part");
  REQUIRE(vf.size() == vp.size());
  for (std::size_t i = 0; i < vf.size(); ++i) {
    CHECK(vf[i].name == vp[i].name);
    CHECK(vf[i].value == vp[i].value);  // bit-identical
  }
}

TEST_CASE(
    "a preempted job checkpoints, leaves a marker, and a plain restart resumes to the same end") {
  tiny_env env;
  auto full = env.job("full");
  full.training.epochs *= 200;  // long enough that the request lands mid-job
  full.checkpoint.every_steps = 0;
  full.checkpoint.save_at_end = true;
  const auto whole = run_job(full);
  const int64_t total = whole["steps"];

  auto part = full;
  part.logging.output_dir = env.tmp / "part";
  job_options o;
  // As SIGTERM's handler does; the job hears it through its watch.
  o.on_progress = [](const progress_info& p) {
    if (p.step >= 20) preemption::request(SIGTERM);
  };
  auto s = run_job(part, o);
  preemption::reset();
  CHECK(s["preempted"] == "SIGTERM");
  const int64_t stopped_at = s["steps"];
  CHECK(stopped_at >= 20);
  CHECK(stopped_at < total);
  const fs::path marker = env.tmp / "part/checkpoints/preempted.json";
  REQUIRE(fs::exists(marker));
  auto m = nlohmann::json::parse(std::ifstream(marker));
  CHECK(m["signal"] == "SIGTERM");
  CHECK(m["step"] == stopped_at);
  CHECK(checkpoint::load(m["checkpoint"].get<std::string>()).meta.step == stopped_at);

  // The same call again, without resume: the marker resumes it.
  auto again = run_job(part);
  CHECK(again["steps"] == total);
  CHECK(again["steps_this_run"] == total - stopped_at);
  CHECK_FALSE(again.contains("preempted"));
  CHECK_FALSE(fs::exists(marker));
  auto vf = final_variables(env.tmp / "full");
  auto vp = final_variables(env.tmp / "part");
  REQUIRE(vf.size() == vp.size());
  for (std::size_t i = 0; i < vf.size(); ++i) CHECK(vf[i].value == vp[i].value);  // bit-identical

  // Asked before the start: it stops at once, with a checkpoint of where it
  // is; --overwrite starts over, marker or not.
  preemption::request(SIGUSR1);
  job_options restart;
  restart.overwrite = true;
  auto early = run_job(part, restart);
  preemption::reset();
  CHECK(early["preempted"] == "SIGUSR1");
  CHECK(early["steps"] < total);
  CHECK(fs::exists(marker));
  auto over = run_job(part, restart);
  CHECK(over["steps_this_run"] == total);
  CHECK_FALSE(fs::exists(marker));
}

TEST_CASE("a job stopped with steps in flight checkpoints the step it names") {
  // A preemption lands while the next steps are in the replicas' mailboxes
  // or between their all-reduce and their update; the checkpoint must still
  // hold the state of the step its manifest names (the loader checks the
  // optimizer's own step count against it).
  tiny_env env;
  auto c = env.job("inflight");
  c.strategy.kind = "mirrored";
  c.strategy.replicas = 2;
  c.training.epochs *= 20;
  c.logging.every_steps = 1;
  c.checkpoint.every_steps = 0;
  for (int64_t at = 3; at < 30; ++at) {
    job_options o;
    o.overwrite = true;
    o.on_progress = [at](const progress_info& p) {
      if (p.step == at) preemption::request(SIGTERM);
    };
    auto s = run_job(c, o);
    preemption::reset();
    REQUIRE(s["preempted"] == "SIGTERM");
    auto latest = checkpoint::resolve(env.tmp / "inflight/checkpoints");
    REQUIRE(latest.has_value());
    checkpoint::snapshot snap;
    REQUIRE_NOTHROW(snap = checkpoint::load(*latest));
    CHECK(snap.meta.step == s["steps"]);
  }
}

TEST_CASE("an injected replica failure ends the job quickly, naming the replica") {
  tiny_env env;
  auto c = env.job("fail");
  job_options o;
  o.faults = inject_faults(fault_injection{}.fail_replica_at(0, 5));
  auto t0 = std::chrono::steady_clock::now();
  try {
    run_job(c, o);
    FAIL("the job should have failed");
  } catch (const job_error& e) {
    std::string w = e.what();
    CHECK(w.find("replica 0") != std::string::npos);
    CHECK(w.find("injected failure at step 5") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("resume errors: no checkpoint, corrupted checkpoint, mismatched model") {
  tiny_env env;
  auto c = env.job("r");
  job_options resume;
  resume.resume = true;
  CHECK_THROWS_WITH_AS(run_job(c, resume), doctest::Contains("no checkpoint found"), job_error);

  run_job(c);
  auto dir = *checkpoint::resolve(env.tmp / "r/checkpoints");
  auto other = c;
  other.model.hidden = {8};
  CHECK_THROWS_WITH_AS(run_job(other, resume), doctest::Contains("dense_0/kernel"), job_error);

  {
    std::fstream f(dir + "/tensors.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char ch = 0;
    f.read(&ch, 1);
    f.seekp(100);
    ch = static_cast<char>(ch ^ 0x5a);
    f.write(&ch, 1);
  }
  CHECK_THROWS_WITH(run_job(c, resume), doctest::Contains("checksum"));
}

// cuda:999 is a device no host has, so the refusal holds with or without
// GPUs; cuda:0 is refused only where there is none (as in test_devices).
TEST_CASE("a cuda device the host does not have is refused with a clear message") {
  tiny_env env;
  auto c = env.job("cuda");
  c.devices = {"cuda:999"};
  CHECK_THROWS_WITH_AS(run_job(c), doctest::Contains("devices[0]: cuda:999 requested, but "),
                       job_error);
  if (cuda_device_count() == 0) {
    c.devices = {"cuda:0"};
    CHECK_THROWS_WITH_AS(run_job(c),
                         doctest::Contains("devices[0]: cuda:0 requested, but no CUDA device"),
                         job_error);
  }
}

namespace {

caf::behavior thrower(caf::event_based_actor* self, bool std_exception) {
  keep_exception_cause(self, "thrower");
  return {[std_exception](int32_t) -> int32_t {
    if (std_exception) throw std::runtime_error("the disk is on fire");
    throw 42;
  }};
}

}  // namespace

TEST_CASE("an actor that throws ends with the exception's message as its exit reason") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  for (bool std_exception : {true, false}) {
    const std::string expected = std_exception
                                     ? "thrower: the disk is on fire"
                                     : "thrower: an exception not derived from std::exception";
    auto a = sys.spawn(thrower, std_exception);
    caf::scoped_actor self{sys};
    self->monitor(a);
    std::string reply, down;
    self->request(a, std::chrono::seconds(30), int32_t{1})
        .receive([&](int32_t) { reply = "answered"; }, [&](caf::error& e) { reply = describe(e); });
    self->receive([&](caf::down_msg& dm) { down = describe(dm.reason); });
    CHECK(reply == expected);  // was "system_error(runtime_error)"
    CHECK(down == expected);
  }
}

TEST_CASE("a peer's failure names the replica that stopped first, for the coordinator") {
  CHECK(replica_stopped(2) == "replica 2 stopped");
  const std::string peer_failed =
      "replica 0: all_reduce: the group was aborted: " + replica_stopped(12);
  CHECK(replica_named_stopped(peer_failed, 0) == std::optional<int64_t>{12});
  CHECK(replica_named_stopped(peer_failed, 12) == std::nullopt);  // its own name
  CHECK(replica_named_stopped("reducer collectives: rank 1 left: replica 3 stopped", 1) ==
        std::optional<int64_t>{3});
  CHECK(replica_named_stopped("replica 1: injected failure at step 2", 0) == std::nullopt);
  CHECK(replica_named_stopped("replica stopped", 0) == std::nullopt);
  CHECK(replica_named_stopped("replica 4 stopped the press", 0) == std::optional<int64_t>{4});
  CHECK(replica_named_stopped("replica 99999999999999999999 stopped", 0) == std::nullopt);
}

TEST_CASE("the job reports the failure of the replica that stopped first") {
  const std::string first = "replica 1 (cpu:1) stopped: replica 1: injected failure";
  const auto secondary = [](int i) {
    return "replica " + std::to_string(i) + " (cpu:" + std::to_string(i) +
           ") stopped: all_reduce: the group was aborted: " + replica_stopped(1);
  };
  SUBCASE("the peers' downs come first: both are held for replica 1's") {
    failure_order order(3);
    CHECK(order.replica_down(2, secondary(2), secondary(2)) == std::nullopt);
    CHECK(order.replica_down(0, secondary(0), secondary(0)) == std::nullopt);
    CHECK(order.replica_down(1, first, first) == first);
  }
  SUBCASE("replica 1's down comes first: it is reported at once") {
    failure_order order(3);
    CHECK(order.replica_down(1, first, first) == first);
    CHECK(order.replica_down(0, secondary(0), secondary(0)) == secondary(0));
  }
  SUBCASE("replica 1 is lost and the job goes on: the failure held for it is reported") {
    failure_order order(3);
    CHECK(order.replica_down(0, secondary(0), secondary(0)) == std::nullopt);
    CHECK(order.replica_down(1, first, std::nullopt) == secondary(0));
  }
  SUBCASE("a replica the job does not have is never waited for") {
    failure_order order(1);
    CHECK(order.replica_down(0, secondary(0), secondary(0)) == secondary(0));
  }
}

TEST_CASE("a checkpoint of diverged weights is not written; the last good one stays") {
  tiny_env env;
  auto c = env.job("nan");
  auto plan = make_plan(c, {});
  model_state ms{{{"dense_0/kernel", tensor::from<float>({2}, {1.0f, 2.0f})}}, {}, {}};
  auto good = save_job_checkpoint(*plan, 10, ms);
  model_state bad{{{"dense_0/kernel", tensor::from<float>({2}, {1.0f, std::nanf("")})}}, {}, {}};
  CHECK_THROWS_WITH_AS(save_job_checkpoint(*plan, 20, bad),
                       doctest::Contains("training diverged: variable 'dense_0/kernel' holds NaN "
                                         "or infinite values at step 20; no checkpoint written"),
                       job_error);
  model_state inf{{{"dense_0/kernel", tensor::from<float>({2}, {INFINITY, 0.0f})}}, {}, {}};
  CHECK_THROWS_AS(save_job_checkpoint(*plan, 30, inf), job_error);
  // The latest checkpoint is still the good one, whole.
  auto latest = checkpoint::resolve(plan->checkpoint_dir);
  REQUIRE(latest);
  CHECK(fs::path(*latest).filename() == fs::path(good).filename());
  CHECK(checkpoint::load(*latest).meta.step == 10);
}
