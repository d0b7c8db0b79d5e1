// Steps on a device-resident data set (data.placement, models/
// resident_steps.hpp) and their capture as graphs (training.step_graphs), on
// sim devices: the recorded graph replays the backend calls with the
// arguments they had when captured, as a CUDA graph does, so a step that
// took a changing value from the host at capture time trains differently
// here too. Each path must train exactly what the host path trains.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "devices/device_context.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"
#include "models/resident_steps.hpp"
#include "runtime/job.hpp"
#include "tests/captured_log.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

// The one_device job on sim:0 (400 examples of batch 48: a partial last
// batch of 16 each epoch), several steps an execution, evaluated each epoch.
job_config sim_job(strategy_env& env, const std::string& placement, const std::string& graphs) {
  auto c = env.job("", "adam", 1, 48);
  c.devices = {"sim:0"};
  c.training.epochs = 3;
  c.training.steps_per_execution = 4;
  c.training.eval_every_epochs = 1;
  c.optimizer.schedule.kind = "cosine";  // a learning rate that moves every step
  c.data.placement = placement;
  c.training.step_graphs = graphs;
  c.logging.level = "info";
  return c;
}

}  // namespace

TEST_CASE("one_device on sim: the device-resident data set, captured or not, trains as the host") {
  strategy_env env(400);
  const auto host = variables_of(run_job(sim_job(env, "host", "auto")));
  std::string log_uncaptured, log_captured;
  nlohmann::json uncaptured_summary, captured_summary;
  {
    captured_log log(spdlog::level::info);
    uncaptured_summary = run_job(sim_job(env, "device", "off"));
    log_uncaptured = log.text();
  }
  {
    captured_log log(spdlog::level::info);
    captured_summary = run_job(sim_job(env, "auto", "auto"));
    log_captured = log.text();
  }
  CHECK(max_abs_diff(host, variables_of(uncaptured_summary)) == 0.0);
  CHECK(max_abs_diff(host, variables_of(captured_summary)) == 0.0);
  CHECK(log_uncaptured.find("data.placement device: the training set") != std::string::npos);
  CHECK(log_uncaptured.find("steps run uncaptured: training.step_graphs is \"off\"") !=
        std::string::npos);
  CHECK(log_captured.find("data.placement auto: the training set") != std::string::npos);
  CHECK(log_captured.find("replays as a captured graph") != std::string::npos);
  CHECK(log_captured.find("could not be captured") == std::string::npos);
}

TEST_CASE("a captured step with dropout and batch norm draws each step's masks, as the host") {
  // Dropout's seed changes every step: read from the device's step counter,
  // a replayed graph draws new masks; baked at capture time, it would not.
  strategy_env env(400);
  auto layered = [&](const std::string& placement) {
    auto c = sim_job(env, placement, "auto");
    c.model.kind = "layers";
    c.model.layers = nlohmann::json::parse(R"([
        {"type": "flatten"}, {"type": "dense", "units": 24}, {"type": "batch_norm"},
        {"type": "relu"},
        {"type": "dropout", "rate": 0.3}, {"type": "dense", "units": 10}])");
    return c;
  };
  const auto host = variables_of(run_job(layered("host")));
  std::string log;
  nlohmann::json captured;
  {
    captured_log capture(spdlog::level::info);
    captured = run_job(layered("device"));
    log = capture.text();
  }
  CHECK(max_abs_diff(host, variables_of(captured)) == 0.0);
  CHECK(log.find("replays as a captured graph") != std::string::npos);
}

TEST_CASE("resident steps: captured once per shape, replayed after, figures as train_batch") {
  const int64_t n = 40, features = 6, rows = 8;
  model_config mc;
  mc.hidden = {5};
  optimizer_config oc;
  oc.kind = "adam";
  oc.learning_rate = 0.05;
  oc.schedule.kind = "cosine";
  tensor images({n, features});
  tensor labels({n}, dtype::i32);
  auto noise = random_floats(static_cast<std::size_t>(n * features), 5);
  std::copy(noise.begin(), noise.end(), images.f32());
  for (int64_t i = 0; i < n; ++i) labels.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
  const model_shape shape{features, 3};

  // The reference: host memory, train_batch and apply() step after step.
  auto ref = create_model(mc, shape, 9);
  kernels::optimizer ref_opt(oc, 30);
  ref_opt.init(ref->variables());
  auto grads = ref->make_gradients();

  auto sim = make_device_context(parse_device("sim:0"));
  auto net = create_model_on(mc, shape, 9, sim);
  kernels::optimizer opt(oc, 30);
  opt.init(net->variables());
  std::vector<std::vector<device_buffer>> slot_memory(2);
  std::vector<std::vector<float*>> slots(2);
  for (std::size_t k = 0; k < 2; ++k)
    for (const auto& t : opt.slot_tensors(k)) {
      slot_memory[k].push_back(sim->allocate(t.nbytes()));
      sim->copy_to_device(slot_memory[k].back().data(), t.raw(), t.nbytes());
      slots[k].push_back(slot_memory[k].back().f32());
    }
  REQUIRE(net->attach_dataset(images, labels));
  std::vector<std::string> notes;
  resident_steps steps(*net, n, opt, sim, slots,
                       {true, [&](const std::string& s) { notes.push_back(s); }});
  REQUIRE(steps.captures());

  // Three executions of 3 steps: 8 rows each, the last step of each 4 rows.
  int64_t next_row = 0;
  for (int exec = 0; exec < 3; ++exec) {
    std::vector<tensor> ids;
    for (int k = 0; k < 3; ++k) {
      const int64_t b = k == 2 ? rows / 2 : rows;
      tensor t({b}, dtype::i64);
      for (int64_t r = 0; r < b; ++r) t.data<int64_t>()[r] = (next_row + r * 7) % n;
      next_row += b;
      ids.push_back(t);
    }
    std::vector<resident_steps::step> plan;
    for (const auto& t : ids) plan.push_back({&t, t.numel()});
    const auto got = steps.run(plan);
    REQUIRE(got.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      const int64_t b = ids[k].numel();
      tensor x({b, features});
      tensor y({b}, dtype::i32);
      for (int64_t r = 0; r < b; ++r) {
        const int64_t row = ids[k].data<int64_t>()[r];
        std::copy(images.f32() + row * features, images.f32() + (row + 1) * features,
                  x.f32() + r * features);
        y.data<int32_t>()[r] = labels.data<int32_t>()[row];
      }
      const auto want = ref->train_batch(x, y, 1.0f / static_cast<float>(b), grads);
      ref_opt.apply(ref->variables(), grads);
      CAPTURE(exec);
      CAPTURE(k);
      CHECK(got[k].loss_sum == want.loss_sum);
      CHECK(got[k].correct == want.correct);
      CHECK(got[k].count == b);
    }
  }
  CHECK(opt.step() == 9);
  net->variables_to_host();
  CHECK(max_abs_diff(ref->variables(), net->variables()) == 0.0);
  // Two shapes (8 and 4 rows): each ran once as it is, then was captured.
  const auto c = steps.statistics();
  CHECK(c.graphs == 2);
  CHECK(c.uncaptured == 2);
  CHECK(c.replays == 7);
  // The step's backend calls: one gather for the rows and their labels, the
  // products, loss and gradients, one Adam, one call for the figures and the
  // step count.
  CHECK(c.operations == 10);
  CHECK(notes.empty());

  tensor bad({2}, dtype::i64);
  bad.data<int64_t>()[0] = 0;
  bad.data<int64_t>()[1] = n;
  CHECK_THROWS_WITH_AS(steps.run({{&bad, 2}}),
                       doctest::Contains("row 40 outside the data set's 40 rows"),
                       std::out_of_range);
}

TEST_CASE("a captured step replays the values it was captured with, and refuses transfers") {
  auto sim = make_device_context(parse_device("sim:0"));
  auto buf = sim->allocate(4 * sizeof(float));
  float value = 1.0f;
  auto graph = sim->capture([&] { sim->ops().fill(buf.f32(), value, 4); });
  REQUIRE(graph);
  CHECK(graph->operations() == 1);
  float out[4] = {};
  sim->copy_to_host(out, buf.data(), sizeof out);
  CHECK(std::isnan(out[0]));  // captured, not run
  value = 2.0f;
  graph->launch();
  sim->copy_to_host(out, buf.data(), sizeof out);
  CHECK(out[3] == 1.0f);  // the value at capture time, as a CUDA graph has it
  const float host[4] = {};
  CHECK_THROWS_WITH_AS(
      sim->capture([&] { sim->copy_to_device(buf.data(), host, sizeof host); }),
      "sim:0: copy_to_device inside a captured step (a graph cannot replay a transfer)",
      device_error);
  // The failed capture left the device as it was: transfers work again.
  sim->copy_to_device(buf.data(), host, sizeof host);
  auto cpu = make_device_context(parse_device("cpu:0"));
  CHECK(cpu->capture([] {}) == nullptr);
}

TEST_CASE(
    "data.placement, training.step_graphs and training.tf32: values and where \"device\" applies") {
  strategy_env env(100);
  auto refused = [&](job_config c, const std::string& what) {
    CHECK_THROWS_WITH(parse_job_config(to_json(c)), doctest::Contains(what.c_str()));
  };
  auto c = env.job("", "adam", 1, 32);
  c.devices = {"sim:0"};
  c.data.placement = "device";
  CHECK_NOTHROW(parse_job_config(to_json(c)));
  auto on_cpu = c;
  on_cpu.devices = {"cpu:0"};
  refused(on_cpu, "data.placement: \"device\" needs a device with memory of its own");
  auto mirrored = env.job("mirrored", "adam", 2, 32);
  mirrored.devices = {"sim:0", "sim:1"};
  mirrored.data.placement = "device";
  refused(mirrored, "the mirrored strategy gathers on the host");
  auto j = to_json(c);
  j["data"]["placement"] = "gpu";
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("data.placement"));
  j["data"]["placement"] = "host";
  j["training"]["step_graphs"] = "on";
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("training.step_graphs"));
  j["training"]["step_graphs"] = "off";
  CHECK(parse_job_config(j).training.step_graphs == "off");
  CHECK(parse_job_config(j).training.tf32 == "convolutions");  // PyTorch's default
  for (const char* v : {"off", "all", "convolutions"}) {
    j["training"]["tf32"] = v;
    CHECK(parse_job_config(j).training.tf32 == v);
    CHECK(to_json(parse_job_config(j))["training"]["tf32"] == v);  // in the effective config
  }
  j["training"]["tf32"] = true;
  CHECK_THROWS_WITH(parse_job_config(j), doctest::Contains("training.tf32"));
}
