// input_pipeline: slicing of global batches over replicas, micro-batches,
// determinism and resume positions.
#include <doctest/doctest.h>

#include <future>
#include <set>

#include "actors/input_pipeline.hpp"
#include "actors/system_config.hpp"

using namespace troupe;

namespace {

// A dataset whose single feature is the example's index, so batches can be
// traced back to examples.
std::shared_ptr<const data::dataset> indexed_dataset(int64_t n) {
  auto d = std::make_shared<data::dataset>();
  d->images = tensor({n, 1});
  d->labels = tensor({n}, dtype::i32);
  for (int64_t i = 0; i < n; ++i) {
    d->images.f32()[i] = static_cast<float>(i);
    d->labels.data<int32_t>()[i] = static_cast<int32_t>(i % 10);
  }
  return d;
}

std::vector<int64_t> ids(const tensor& x) {
  std::vector<int64_t> r;
  for (float v : x.span<float>()) r.push_back(static_cast<int64_t>(v));
  return r;
}

batch next_batch(caf::scoped_actor& self, input_pipeline_actor& p) {
  batch out;
  self->request(p, std::chrono::seconds(5), next_atom::value)
      .receive([&](batch& b) { out = std::move(b); }, [&](caf::error& e) { FAIL(describe(e)); });
  return out;
}

}  // namespace

TEST_CASE("replica_slice and batches_per_epoch") {
  CHECK(batches_per_epoch(50, 16) == 4);
  CHECK(batches_per_epoch(48, 16) == 3);
  CHECK(batches_per_epoch(50, 16, 3) == 2);  // updates of 48 examples
  // 10 examples over 4 replicas: 3, 3, 2, 2
  CHECK(replica_slice(10, 4, 0) == std::pair<int64_t, int64_t>{0, 3});
  CHECK(replica_slice(10, 4, 1) == std::pair<int64_t, int64_t>{3, 6});
  CHECK(replica_slice(10, 4, 2) == std::pair<int64_t, int64_t>{6, 8});
  CHECK(replica_slice(10, 4, 3) == std::pair<int64_t, int64_t>{8, 10});
  // 2 examples over 4 replicas: the last two get nothing
  CHECK(replica_slice(2, 4, 2) == std::pair<int64_t, int64_t>{2, 2});
  CHECK(replica_slice(2, 4, 3) == std::pair<int64_t, int64_t>{2, 2});
}

TEST_CASE("pipelines of N replicas cover every example exactly once per epoch") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  const int64_t n = 50, k = 4, gb = 16;
  auto data = indexed_dataset(n);
  std::vector<input_pipeline_actor> ps;
  for (int64_t r = 0; r < k; ++r) {
    input_pipeline_config ic;
    ic.data = data;
    ic.global_batch = gb;
    ic.seed = 9;
    ic.context = {1, 0, k};
    ic.replica = r;
    ps.push_back(sys.spawn(input_pipeline, ic));
  }
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    for (int64_t b = 0; b < batches_per_epoch(n, gb); ++b) {
      int64_t global = b == 3 ? 2 : 16;
      for (int64_t r = 0; r < k; ++r) {
        self->request(ps[static_cast<std::size_t>(r)], std::chrono::seconds(5), next_atom::value)
            .receive(
                [&](batch& got) {
                  CHECK(got.epoch == epoch);
                  CHECK(got.index == b);
                  CHECK(got.global_size == global);
                  REQUIRE(got.x.size() == 1);
                  auto [lo, hi] = replica_slice(global, k, r);
                  CHECK(got.x[0].dim(0) == hi - lo);
                  CHECK(got.y[0].dim(0) == hi - lo);
                  for (auto i : ids(got.x[0])) seen.insert(i);
                },
                [&](caf::error& e) { FAIL(describe(e)); });
      }
    }
    CHECK(seen.size() == static_cast<std::size_t>(n));
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == static_cast<std::size_t>(n));
  }
  for (auto& p : ps) self->send_exit(p, caf::exit_reason::user_shutdown);
}

TEST_CASE("micro-batches of an update, determinism, and resume position") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto data = indexed_dataset(40);
  auto make = [&](int64_t start_epoch, int64_t start_index) {
    input_pipeline_config ic;
    ic.data = data;
    ic.global_batch = 6;
    ic.steps_per_update = 3;  // updates of 18: 18, 18, 4
    ic.seed = 5;
    ic.start_epoch = start_epoch;
    ic.start_index = start_index;
    return sys.spawn(input_pipeline, ic);
  };
  auto next = [&](input_pipeline_actor& p) { return next_batch(self, p); };
  auto a = make(0, 0);
  auto b = make(0, 0);
  std::vector<batch> stream;
  for (int i = 0; i < 5; ++i) {
    stream.push_back(next(a));
    auto other = next(b);
    for (std::size_t m = 0; m < 3; ++m) CHECK(ids(other.x[m]) == ids(stream.back().x[m]));
  }
  CHECK(stream[0].global_size == 18);
  CHECK(stream[2].global_size == 4);
  CHECK(stream[2].x[0].dim(0) == 4);  // 4 left: one partial micro-batch, two empty
  CHECK(stream[2].x[1].dim(0) == 0);
  CHECK(stream[2].x[2].dim(0) == 0);
  CHECK(stream[3].epoch == 1);
  CHECK(stream[3].index == 0);
  CHECK(ids(stream[3].x[0]) != ids(stream[0].x[0]));  // reshuffled
  // A pipeline started at (epoch 1, update 1) continues the same stream.
  auto c = make(1, 1);
  auto resumed = next(c);
  for (std::size_t m = 0; m < 3; ++m) CHECK(ids(resumed.x[m]) == ids(stream[4].x[m]));
  for (auto* p : {&a, &b, &c}) self->send_exit(*p, caf::exit_reason::user_shutdown);
}

TEST_CASE("batches gathered on a device are the pipeline's own, in order") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto data = indexed_dataset(700);
  // Two idle devices of one group: a pipeline's batches are gathered on both
  // at once and may finish out of order.
  auto group = std::make_shared<device_group>();
  auto device = std::make_shared<cpu_device>("test:cpu:0", group);
  auto other = std::make_shared<cpu_device>("test:cpu:1", group);
  auto make = [&](int64_t replica, std::shared_ptr<cpu_device> dev) {
    input_pipeline_config ic;
    ic.data = data;
    ic.global_batch = 200;    // 2 replicas: 100 rows each (two device pieces),
    ic.steps_per_update = 2;  // two micro-batches per update: 400, then 300
    ic.seed = 3;
    ic.prefetch = 4;
    ic.context = {1, 0, 2};
    ic.replica = replica;
    ic.gather_device = std::move(dev);
    return sys.spawn(input_pipeline, ic);
  };
  auto next = [&](input_pipeline_actor& p) { return next_batch(self, p); };
  for (int64_t r = 0; r < 2; ++r) {
    auto here = make(r, nullptr);
    auto there = make(r, device);  // both replicas' pipelines share one device
    for (int i = 0; i < 12; ++i) {
      auto a = next(here);
      auto b = next(there);
      // The batch came through CAF's mailboxes, which ThreadSanitizer cannot
      // see (libcaf is not instrumented): a task on each device, waited for,
      // orders the devices' writes before this thread's reads in its terms.
      for (auto* d : {&device, &other}) {
        std::promise<void> passed;
        (*d)->submit([&passed] { passed.set_value(); });
        passed.get_future().wait();
      }
      CHECK(a.epoch == b.epoch);
      CHECK(a.index == b.index);
      CHECK(a.global_size == b.global_size);
      REQUIRE(b.x.size() == 2);
      for (std::size_t m = 0; m < 2; ++m) {
        CHECK(a.x[m] == b.x[m]);
        CHECK(a.y[m] == b.y[m]);
      }
    }
    for (auto* p : {&here, &there}) self->send_exit(*p, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("batches left for the step hold the pipeline's rows once filled, copied once") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto data = indexed_dataset(700);
  auto make = [&](bool in_step) {
    input_pipeline_config ic;
    ic.data = data;
    ic.global_batch = 200;
    ic.steps_per_update = 2;  // two micro-batches per update: 400, then 300
    ic.seed = 3;
    ic.context = {1, 0, 2};
    ic.replica = 1;
    ic.gather_in_step = in_step;
    return sys.spawn(input_pipeline, ic);
  };
  auto here = make(false);
  auto later = make(true);
  for (int i = 0; i < 5; ++i) {
    auto a = next_batch(self, here);
    auto b = next_batch(self, later);
    CHECK_FALSE(a.pending);
    REQUIRE(b.pending);
    CHECK(a.epoch == b.epoch);
    CHECK(a.index == b.index);
    CHECK(a.global_size == b.global_size);
    REQUIRE(b.x.size() == a.x.size());
    for (std::size_t m = 0; m < a.x.size(); ++m) {
      CHECK(b.x[m].shape() == a.x[m].shape());  // allocated already
      CHECK(b.ids[m] == a.ids[m]);
    }
    // A copy of the batch (as a CAF message makes) fills the same buffers.
    const batch copy = b;
    copy.fill_rows();
    for (std::size_t m = 0; m < a.x.size(); ++m) {
      CHECK(b.x[m] == a.x[m]);
      CHECK(b.y[m] == a.y[m]);
    }
    // Once: a second call copies nothing over rows written since.
    b.x[0].f32()[0] = -1.0f;
    b.fill_rows();
    CHECK(b.x[0].f32()[0] == -1.0f);
  }
  for (auto* p : {&here, &later}) self->send_exit(*p, caf::exit_reason::user_shutdown);
}
