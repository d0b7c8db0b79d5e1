#pragma once
// Test fixtures: temporary directories, a tiny, learnable IDX dataset,
// reproducible random inputs, and reading back what a job wrote.
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "data/idx.hpp"
#include "models/random.hpp"

namespace troupe::test {

// How long a test waits for what takes well under a second before calling
// it a hang: 10 s, five times that under the sanitizers (which slow the
// runtime several-fold). How fast it happens is a benchmark's figure
// (bench/), never a test's bound.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr std::chrono::seconds kHangGuard{50};
#else
constexpr std::chrono::seconds kHangGuard{10};
#endif

// A fresh directory under the system temp dir, removed on destruction.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("troupe-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

// Writes Fashion-MNIST-named IDX files of side x side images where class c
// lights up its own band of pixels, plus noise: easy to learn, not trivial.
inline void write_tiny_dataset(const std::string& dir, int64_t train_n, int64_t test_n,
                               int64_t side = 8, uint64_t seed = 7) {
  splitmix64 g(seed);
  auto make = [&](const std::string& prefix, int64_t n) {
    std::vector<uint8_t> img(static_cast<std::size_t>(n * side * side));
    std::vector<uint8_t> lab(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      auto c = static_cast<uint8_t>(g.next() % 10);
      lab[static_cast<std::size_t>(i)] = c;
      for (int64_t p = 0; p < side * side; ++p) {
        bool on = (p * 10 / (side * side)) == c;
        auto noise = static_cast<int>(g.next() % 96);
        img[static_cast<std::size_t>(i * side * side + p)] =
            static_cast<uint8_t>(on ? 255 - noise : noise);
      }
    }
    data::write_idx(dir + "/" + prefix + "-images-idx3-ubyte.gz", {n, side, side}, img, true);
    data::write_idx(dir + "/" + prefix + "-labels-idx1-ubyte.gz", {n}, lab, true);
  };
  make("train", train_n);
  make("t10k", test_n);
}

// A small job on the tiny dataset in `dir`.
inline job_config tiny_job(const std::string& data_dir, const std::string& out_dir) {
  job_config c;
  c.name = "tiny";
  c.seed = 3;
  c.model.hidden = {16};
  c.optimizer.kind = "adam";
  c.optimizer.learning_rate = 0.01;
  c.data.path = data_dir;
  c.data.batch_size = 32;
  c.training.epochs = 3;
  c.logging.every_steps = 5;
  c.logging.output_dir = out_dir;
  c.logging.level = "warn";
  return c;
}

// n floats uniform in [lo, hi), the same for the same seed.
inline std::vector<float> random_floats(std::size_t n, unsigned seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// The bytes of the file at `path`; "" where there is none (yet).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lines of a job's <output_dir>/metrics.jsonl whose "type" is `type`,
// in the order written.
inline std::vector<nlohmann::json> metrics_lines(const std::filesystem::path& output_dir,
                                                 const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream in(output_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == type) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace troupe::test
