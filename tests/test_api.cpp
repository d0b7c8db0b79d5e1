// The public API (api/troupe.hpp): custom training loops on a replica_group, and
// a program's own model named in a job config.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "api/troupe.hpp"
// The runtime's own strategy interface beside the public API in one program:
// the two must not share a name (they once were both troupe::strategy).
#include "strategies/strategy.hpp"

using namespace troupe;

TEST_CASE("replica_group::run calls the step on every replica, each on its own thread") {
  auto s = replica_group::mirrored(3);
  REQUIRE(s.num_replicas() == 3);
  std::mutex mu;
  std::set<std::thread::id> threads;
  auto ids = s.run([&](replica_context& ctx) {
    std::lock_guard<std::mutex> g(mu);
    threads.insert(std::this_thread::get_id());
    CHECK(ctx.num_replicas() == 3);
    return ctx.replica_id() * 10;
  });
  CHECK(ids == std::vector<int>{0, 10, 20});
  CHECK(threads.size() == 3);
  CHECK(threads.count(std::this_thread::get_id()) == 0);
  CHECK(replica_group::reduce(reduce_op::sum, {1, 2, 3.5}) == 6.5);
  CHECK(replica_group::reduce(reduce_op::mean, {1, 2, 3}) == 2);
  CHECK(replica_group::mirrored(0).num_replicas() == usable_cpu_cores());
  CHECK_THROWS_WITH(replica_group::mirrored(2, "butterfly"),
                    "replica_group::mirrored: unknown all-reduce algorithm 'butterfly'");
}

TEST_CASE("replica_context::all_reduce: sum and mean across replicas, in place") {
  for (const char* algorithm : {"ring", "tree", "reduce_to_one"}) {
    CAPTURE(algorithm);
    auto s = replica_group::mirrored(3, algorithm);
    auto results = s.run([](replica_context& ctx) {
      // Replica r holds r+1 everywhere, in two tensors of different shapes.
      const float v = static_cast<float>(ctx.replica_id() + 1);
      std::vector<named_tensor> ts{{"a", tensor::from<float>({2, 3}, std::vector<float>(6, v))},
                                   {"b", tensor::from<float>({5}, std::vector<float>(5, v))}};
      const float* a_before = ts[0].value.f32();
      ctx.all_reduce(ts, reduce_op::mean);
      CHECK(ts[0].value.f32() == a_before);  // the caller's buffer, reduced in place
      std::vector<tensor> sum{tensor::from<float>({4}, std::vector<float>(4, v))};
      ctx.all_reduce(sum, reduce_op::sum);
      const double scalar = ctx.all_reduce(static_cast<double>(v), reduce_op::max);
      return std::vector<double>{ts[0].value.f32()[5], ts[1].value.f32()[0], sum[0].f32()[3],
                                 scalar};
    });
    for (const auto& r : results) CHECK(r == std::vector<double>{2, 2, 6, 3});
  }
}

TEST_CASE("a throwing step names its replica; its peers waiting in a collective are released") {
  auto s = replica_group::mirrored(3);
  std::atomic<int> released{0};
  CHECK_THROWS_WITH(s.run([&](replica_context& ctx) {
    if (ctx.replica_id() == 1) throw std::runtime_error("bad batch");
    std::vector<tensor> t{tensor({8})};
    try {
      ctx.all_reduce(t, reduce_op::sum);  // replica 1 never comes
    } catch (const std::runtime_error&) {
      ++released;
      throw;
    }
  }),
                    "replica 1: bad batch");
  CHECK(released == 2);
  // The group still works afterwards (a new reducer group).
  auto sums = s.run([](replica_context& ctx) { return ctx.all_reduce(1.0, reduce_op::sum); });
  CHECK(sums == std::vector<double>{3, 3, 3});
}

TEST_CASE("distributed_dataset: each global batch split across the replicas, every example once") {
  data::dataset d;
  const int64_t n = 103;
  d.images = tensor({n, 2});
  d.labels = tensor({n}, dtype::i32);
  for (int64_t i = 0; i < n; ++i) {
    d.images.f32()[2 * i] = static_cast<float>(i);
    d.labels.data<int32_t>()[i] = static_cast<int32_t>(i % 10);
  }
  distributed_dataset ds(d, 20, 3, 5);
  REQUIRE(ds.steps_per_epoch() == 6);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    for (int64_t step = 0; step < ds.steps_per_epoch(); ++step) {
      int64_t batch_rows = 0;
      for (int r = 0; r < 3; ++r) {
        tensor x, y;
        ds.batch(epoch, step, r, x, y);
        REQUIRE(x.dim(0) == ds.rows(epoch, step, r));
        batch_rows += x.dim(0);
        for (int64_t i = 0; i < x.dim(0); ++i) seen.push_back(static_cast<int64_t>(x.f32()[2 * i]));
      }
      CHECK(batch_rows == std::min<int64_t>(20, n - step * 20));
      // 20 over 3 replicas: 7, 7, 6 (the first B % N take one more).
      if (step == 0) CHECK(ds.rows(epoch, 0, 2) == 6);
    }
    // The epoch's order is troupe's own (data::epoch_order), cut in order.
    CHECK(seen == data::epoch_order(n, 5, epoch, true));
  }
  CHECK_THROWS(distributed_dataset(d, 2, 3, 5));
}

TEST_CASE("a program's own model, registered, is named in a job config and trained by run_job") {
  register_model("api_test_linear", [](const model_config& c, const model_shape& s, uint64_t seed) {
    model_config linear = c;
    linear.kind = "mlp";
    linear.hidden = {};
    return create_model(linear, s, seed);
  });
  auto c = parse_job_config(nlohmann::json::parse(R"({
    "name": "api_registered_model",
    "model": {"kind": "api_test_linear"},
    "strategy": {"kind": "mirrored", "replicas": 2},
    "data": {"train_limit": 2000, "test_limit": 500, "batch_size": 100},
    "training": {"epochs": 2},
    "checkpoint": {"every_steps": 0, "save_at_end": false}
  })"));
  job_options o;
  o.output_dir = std::string(TROUPE_BINARY_DIR) + "/api-registered-model";
  o.overwrite = true;
  std::vector<nlohmann::json> epoch_lines;
  o.on_epoch = [&](const nlohmann::json& line) { epoch_lines.push_back(line); };
  const auto summary = run_job(c, o);
  REQUIRE(epoch_lines.size() == 2);
  CHECK(summary["test_accuracy"].get<double>() > 0.6);
  // train_seconds leaves the evaluation after epoch 0 out of epoch 1's time;
  // elapsed_seconds counts it.
  const auto train = [&](std::size_t e) { return epoch_lines[e]["train_seconds"].get<double>(); };
  const auto elapsed = [&](std::size_t e) {
    return epoch_lines[e]["elapsed_seconds"].get<double>();
  };
  CHECK(train(0) > 0);
  CHECK(train(0) <= elapsed(0));
  CHECK(train(1) > train(0));
  CHECK(elapsed(1) - train(1) > elapsed(0) - train(0));
  CHECK(summary["train_seconds"].get<double>() >= train(1));
  // A name nobody registered is still a config error.
  CHECK_THROWS_AS(parse_job_config(nlohmann::json::parse(R"({"model": {"kind": "nope"}})")),
                  config_error);
}
