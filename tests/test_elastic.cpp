// Elastic averaging SGD: checked against the paper's update equations on a
// problem small enough to compute by hand, and against independent training
// when the moving rate is 0.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "actors/fault_injection.hpp"
#include "actors/input_pipeline.hpp"
#include "checkpoint/checkpoint.hpp"
#include "data/dataset.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"
#include "runtime/job.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

// f(w) = mean over the batch of 0.5 |w - x_e|^2: gradient w - mean(x_e).
class quadratic_model final : public model {
 public:
  explicit quadratic_model(int64_t features) {
    tensor w({features});
    for (int64_t j = 0; j < features; ++j) w.f32()[j] = 0.01f * static_cast<float>(j % 7);
    vars_.push_back({"w", w});
  }
  std::vector<named_tensor>& variables() override { return vars_; }
  batch_stats train_batch(const tensor& x, const tensor& y, float scale,
                          std::vector<named_tensor>& grads, bool accumulate) override {
    (void)y;
    float* g = grads[0].value.f32();
    const float* w = vars_[0].value.f32();
    const int64_t f = vars_[0].value.numel();
    if (!accumulate)
      for (int64_t j = 0; j < f; ++j) g[j] = 0;
    batch_stats s;
    const int64_t n = x.empty() ? 0 : x.dim(0);
    for (int64_t e = 0; e < n; ++e)
      for (int64_t j = 0; j < f; ++j) {
        float r = w[j] - x.f32()[e * f + j];
        g[j] += scale * r;
        s.loss_sum += 0.5 * double(r) * double(r);
      }
    s.count = n;
    return s;
  }
  batch_stats evaluate(const tensor& x, const tensor& y) override {
    std::vector<named_tensor> g = make_gradients();
    return train_batch(x, y, 1.0f, g, false);
  }

 private:
  std::vector<named_tensor> vars_;
};

struct env_t {
  test::temp_dir tmp;
  std::string data = tmp / "data";
  int runs = 0;
  explicit env_t(int64_t train_n) {
    spdlog::set_level(spdlog::level::warn);
    fs::create_directories(data);
    test::write_tiny_dataset(data, train_n, 20);
  }
  job_config job(int64_t workers, int64_t batch) {
    auto c = test::tiny_job(data, tmp / ("run" + std::to_string(runs++)));
    c.strategy.kind = "elastic_average";
    c.strategy.replicas = workers;
    c.strategy.max_staleness = 0;  // equal steps per worker: a deterministic split
    c.data.batch_size = batch;
    c.training.eval_every_epochs = 0;
    c.checkpoint.save_local_copies = true;
    c.devices.clear();
    for (int64_t r = 0; r < workers; ++r) c.devices.push_back("cpu:" + std::to_string(r));
    return c;
  }
};

// The batch worker w trains on at its local step s: the input pipeline's
// slicing (a round of workers x batch examples, worker w's slice).
void worker_batch(const data::dataset& d, const job_config& c, int64_t w, int64_t s, tensor& x,
                  tensor& y) {
  const int64_t W = c.strategy.replicas, g = c.data.batch_size * W, n = d.size();
  const int64_t rounds = batches_per_epoch(n, g, 1);
  auto order = data::epoch_order(n, c.seed, s / rounds, c.data.shuffle);
  int64_t ub = (s % rounds) * g, ue = std::min(n, ub + g);
  auto [b, e] = replica_slice(ue - ub, W, w);
  data::gather_batch(d, {order.data() + ub + b, static_cast<std::size_t>(e - b)}, x, y);
}

std::map<std::string, tensor> by_name(const std::vector<named_tensor>& ts) {
  std::map<std::string, tensor> m;
  for (const auto& t : ts) m[t.name] = t.value;
  return m;
}

double max_abs_diff(const tensor& a, const tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double worst = 0;
  for (int64_t j = 0; j < a.numel(); ++j)
    worst = std::max(worst, std::abs(double(a.f32()[j]) - double(b.f32()[j])));
  return worst;
}

}  // namespace

TEST_CASE("elastic_average, tau = 1, synchronous, SGD, quadratic loss: the paper's equations") {
  static bool registered = [] {
    register_model("test_quadratic", [](const model_config&, const model_shape& s, uint64_t) {
      return std::make_unique<quadratic_model>(s.features);
    });
    return true;
  }();
  (void)registered;
  env_t env(16);
  auto c = env.job(2, 2);  // 2 workers x 2 examples: 4 rounds per epoch
  c.model.kind = "test_quadratic";
  c.optimizer.kind = "sgd";
  c.optimizer.learning_rate = 0.1;
  c.strategy.communication_period = 1;
  c.strategy.moving_rate = 0.3;
  c.strategy.synchronous = true;
  c.training.epochs = 2;  // 8 steps per worker
  auto s = run_job(c);
  REQUIRE(s["steps"] == 16);

  // x_i(t+1) = x_i(t) - lr grad_i(x_i(t)) - a (x_i(t) - c(t))
  // c(t+1)   = c(t) + sum_i a (x_i(t) - c(t))
  // in float, in the order the runtime computes them.
  auto tt = data::load_fashion_mnist(c.data);
  const auto& d = tt.train;
  quadratic_model init(d.features());
  const int64_t f = d.features();
  std::vector<float> center(init.variables()[0].value.f32(), init.variables()[0].value.f32() + f);
  std::vector<std::vector<float>> x(2, center);
  const float lr = 0.1f, a = 0.3f;
  for (int64_t t = 0; t < 8; ++t) {
    std::vector<float> sum_d(static_cast<std::size_t>(f), 0.0f);
    for (int64_t w = 0; w < 2; ++w) {
      tensor bx, by;
      worker_batch(d, c, w, t, bx, by);
      const int64_t n = bx.dim(0);
      const float scale = 1.0f / static_cast<float>(n);
      for (int64_t j = 0; j < f; ++j) {
        float g = 0;
        for (int64_t e = 0; e < n; ++e) g += scale * (x[w][j] - bx.f32()[e * f + j]);
        float dj = a * (x[w][j] - center[j]);
        x[w][j] -= lr * g;
        x[w][j] -= dj;
        sum_d[j] += dj;
      }
    }
    for (int64_t j = 0; j < f; ++j) center[j] = center[j] - (-1.0f) * sum_d[j];
  }
  auto snap = checkpoint::load(s["checkpoint"].get<std::string>());
  auto locals = by_name(snap.slots);
  double worst = 0;
  for (int64_t j = 0; j < f; ++j) {
    worst = std::max(worst, std::abs(double(snap.variables[0].value.f32()[j]) - center[j]));
    for (int w = 0; w < 2; ++w) {
      const tensor& lx = locals.at("local/" + std::to_string(w) + "/w");
      worst = std::max(worst, std::abs(double(lx.f32()[j]) - x[w][j]));
    }
  }
  MESSAGE("largest difference from the equations: " << worst);
  CHECK(worst <= 1e-6);
  // The center moved: the check is not trivially on the initial values.
  CHECK(std::abs(double(snap.variables[0].value.f32()[3]) - 0.03) > 1e-3);
}

TEST_CASE("elastic_average with moving_rate 0: workers train independently, the center stays") {
  env_t env(200);
  for (std::string opt : {"sgd", "adam"}) {
    CAPTURE(opt);
    auto c = env.job(3, 16);
    c.optimizer.kind = opt;
    c.strategy.communication_period = 2;
    c.strategy.moving_rate = 1e-300;  // 0 means "the default"; this rounds to 0 in float
    auto s = run_job(c);
    const int64_t per_worker = s["steps"].get<int64_t>() / 3;
    auto snap = checkpoint::load(s["checkpoint"].get<std::string>());
    auto locals = by_name(snap.slots);

    auto tt = data::load_fashion_mnist(c.data);
    const auto& d = tt.train;
    auto init = create_model(c.model, {d.features(), d.classes}, c.seed);
    for (std::size_t v = 0; v < snap.variables.size(); ++v)
      CHECK(max_abs_diff(snap.variables[v].value, init->variables()[v].value) == 0);
    for (int64_t w = 0; w < 3; ++w) {
      // One replica alone on this worker's batches: a one_device run.
      auto net = create_model(c.model, {d.features(), d.classes}, c.seed);
      kernels::optimizer o(c.optimizer, s["steps"].get<int64_t>());
      o.init(net->variables());
      auto grads = net->make_gradients();
      for (int64_t t = 0; t < per_worker; ++t) {
        tensor bx, by;
        worker_batch(d, c, w, t, bx, by);
        net->train_batch(bx, by, 1.0f / static_cast<float>(bx.dim(0)), grads);
        o.apply(net->variables(), grads);
      }
      for (auto& v : net->variables()) {
        CAPTURE(w);
        CAPTURE(v.name);
        CHECK(max_abs_diff(locals.at("local/" + std::to_string(w) + "/" + v.name), v.value) < 1e-7);
      }
    }
  }
}

TEST_CASE("elastic_average: lost and late workers; synchronous rounds drop a lost worker") {
  env_t env(480);
  for (bool sync : {false, true}) {
    CAPTURE(sync);
    auto c = env.job(3, 16);
    c.strategy.max_staleness = -1;
    c.strategy.synchronous = sync;
    c.strategy.communication_period = 4;
    c.training.epochs = 4;
    c.checkpoint.every_steps = 30;  // boundaries in the middle of rounds
    job_options o;
    o.faults = inject_faults(fault_injection{}.fail_replica_at(1, 9));
    auto s = run_job(c, o);
    CHECK(s["steps"] == 4 * 3 * 10);
    std::ifstream in(fs::path(s["output_dir"].get<std::string>()) / "metrics.jsonl");
    int lost = 0;
    std::string lines;
    for (std::string line; std::getline(in, line);)
      if (line.find("\"worker_lost\"") != std::string::npos) {
        ++lost;
        lines += line + "\n";
      }
    CHECK_MESSAGE(lost == 1, lines);
  }
  auto c = env.job(3, 16);
  c.strategy.max_staleness = 2;
  c.strategy.communication_period = 3;
  job_options o;
  o.faults = inject_faults(fault_injection{}.join_late_at(2, 20));
  auto s = run_job(c, o);
  std::ifstream in(fs::path(s["output_dir"].get<std::string>()) / "metrics.jsonl");
  int late_pushes = 0, joined = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "worker_joined") ++joined;
    if (j["type"] == "push" && j["worker"] == 2) ++late_pushes;
  }
  CHECK(joined == 1);
  CHECK(late_pushes > 5);
}

TEST_CASE("elastic_average checkpoints hold the center and resume under one_device") {
  env_t env(480);
  auto c = env.job(2, 16);
  c.strategy.communication_period = 2;
  c.checkpoint.save_local_copies = false;
  auto s = run_job(c);
  auto snap = checkpoint::load(s["checkpoint"].get<std::string>());
  for (const auto& t : snap.slots) CHECK(t.name.rfind("local/", 0) == std::string::npos);
  // The center resumes as the model of another strategy (Adam slots from worker 0).
  auto one = test::tiny_job(env.data, s["output_dir"].get<std::string>());
  one.training.epochs = 4;
  one.training.eval_every_epochs = 0;
  job_options resume;
  resume.resume = true;
  auto r = run_job(one, resume);
  CHECK(r["strategy"] == "one_device");
  CHECK(r["steps_this_run"].get<int64_t>() > 0);
}

TEST_CASE("elastic_average on Fashion-MNIST: a worker killed mid-job, a late one, still >= 0.89") {
  test::temp_dir tmp;
  // examples/fashion_mnist_easgd.json, asynchronous.
  auto job = test::fashion_mnist_job("easgd_lost_worker", tmp / "out", 16);
  if (!job) return;
  auto& c = *job;
  c.data.batch_size = 32;
  c.strategy.kind = "elastic_average";
  c.strategy.communication_period = 8;
  c.strategy.moving_rate = 0.225;
  job_options o;
  // Worker 1 fails at its 2001st step, about 1/4 into the job; worker 3
  // starts from the center after 4000 updates.
  o.faults = inject_faults(fault_injection{}.fail_replica_at(1, 2000).join_late_at(3, 4000));
  auto s = run_job(c, o);
  MESSAGE("test accuracy " << s["test_accuracy"] << " after losing worker 1, worker 3 late");
  CHECK(s["test_accuracy"].get<double>() >= 0.89);
  std::ifstream in(fs::path(s["output_dir"].get<std::string>()) / "metrics.jsonl");
  int lost = 0, joined = 0;
  for (std::string line; std::getline(in, line);) {
    lost += line.find("\"worker_lost\"") != std::string::npos;
    joined += line.find("\"worker_joined\"") != std::string::npos;
  }
  CHECK(lost == 1);
  CHECK(joined == 1);
}
