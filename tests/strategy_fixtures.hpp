#pragma once
// Shared by the strategy tests: a tiny dataset and jobs on it, final
// variables from a job's checkpoint, their largest difference, metrics lines.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "tests/fixtures.hpp"
#include "tests/skip.hpp"

namespace troupe::test {

struct strategy_env {
  temp_dir tmp;
  std::string data = tmp / "data";
  int runs = 0;
  explicit strategy_env(int64_t train_n) {
    spdlog::set_level(spdlog::level::warn);
    std::filesystem::create_directories(data);
    write_tiny_dataset(data, train_n, 100);
  }
  // A job of `kind` ("" = one_device) with `replicas` replicas or workers on
  // cpu:0..replicas-1, its own output directory, no evaluation.
  job_config job(const std::string& kind, const std::string& optimizer, int64_t replicas,
                 int64_t batch) {
    auto c = tiny_job(data, tmp / ("run" + std::to_string(runs++)));
    c.optimizer.kind = optimizer;
    c.optimizer.learning_rate = optimizer == "sgd" ? 0.1 : 0.01;
    c.data.batch_size = batch;
    c.training.eval_every_epochs = 0;
    if (!kind.empty()) {
      c.strategy.kind = kind;
      c.strategy.replicas = replicas;
      c.devices.clear();
      for (int64_t r = 0; r < replicas; ++r) c.devices.push_back("cpu:" + std::to_string(r));
    }
    return c;
  }
};

inline std::vector<named_tensor> variables_of(const nlohmann::json& summary) {
  return checkpoint::load(summary["checkpoint"].get<std::string>()).variables;
}

// Largest absolute difference over all variables (names and shapes must match).
inline double max_abs_diff(const std::vector<named_tensor>& a, const std::vector<named_tensor>& b) {
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

// The lines of the job's <output_dir>/metrics.jsonl with this "type" (the
// job given by its summary).
inline std::vector<nlohmann::json> metrics_of(const nlohmann::json& summary,
                                              const std::string& type) {
  return metrics_lines(summary["output_dir"].get<std::string>(), type);
}

// The examples' 4-worker Fashion-MNIST job (MLP 256-256, Adam with a cosine
// schedule), evaluated at the end only; the caller sets the strategy. Empty
// under TROUPE_TEST_QUICK (the ThreadSanitizer run: minutes under TSan), and
// a failed check when the dataset is not installed.
inline std::optional<job_config> fashion_mnist_job(const std::string& name,
                                                   const std::string& out_dir, int64_t epochs) {
  if (std::getenv("TROUPE_TEST_QUICK")) {
    skip_case("TROUPE_TEST_QUICK is set (minutes under ThreadSanitizer)");
    return std::nullopt;
  }
  job_config c;
  if (!std::filesystem::exists(c.data.path + "/train-images-idx3-ubyte.gz")) {
    FAIL_CHECK("Fashion-MNIST is not installed at " << c.data.path
                                                    << " (scripts/install-deps.sh installs it)");
    return std::nullopt;
  }
  spdlog::set_level(spdlog::level::warn);
  c.name = name;
  c.model.hidden = {256, 256};
  c.optimizer.kind = "adam";
  c.optimizer.learning_rate = 0.001;
  c.optimizer.schedule.kind = "cosine";
  c.optimizer.schedule.min_lr = 0.00005;
  c.strategy.replicas = 4;
  c.devices = {"cpu:0", "cpu:1", "cpu:2", "cpu:3"};
  c.training.epochs = epochs;
  c.training.eval_every_epochs = epochs;
  c.logging.every_steps = 100000;
  c.logging.output_dir = out_dir;
  return c;
}

}  // namespace troupe::test
