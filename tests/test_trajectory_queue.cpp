// trajectory_queue: back-pressure (an actor's enqueue is answered only when
// there is room), batches in order, stale unrolls dropped against the
// learners' version, counters, bad settings; and an unroll survives CAF's
// serialization (it crosses processes).
#include <doctest/doctest.h>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "actors/system_config.hpp"
#include "actors/trajectory_queue.hpp"

using namespace troupe;

namespace {

constexpr auto timeout = std::chrono::seconds(10);

unroll make_unroll(int64_t actor, int64_t version) {
  unroll u;
  u.actor = actor;
  u.policy_version = version;
  u.actions = tensor({2, 3}, dtype::i32);
  u.rewards = tensor({2, 3});
  u.rewards.f32()[0] = static_cast<float>(actor);
  return u;
}

struct fixture {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  queue_stats stats(const trajectory_queue_actor& q) {
    queue_stats s;
    self->request(q, timeout, stats_atom::value)
        .receive([&](queue_stats& x) { s = x; }, [](caf::error& e) { FAIL(describe(e)); });
    return s;
  }
};

}  // namespace

TEST_CASE("trajectory_queue: a full queue holds actors back until a learner takes a batch") {
  fixture f;
  auto q = spawn_trajectory_queue(f.sys, {2, -1, {}});
  int64_t depth = 0;
  for (int64_t a = 0; a < 2; ++a)
    f.self->request(q, timeout, enqueue_atom::value, make_unroll(a, 0))
        .receive([&](int64_t d) { depth = d; }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(depth == 2);
  // The third is not answered while the queue is full.
  auto third = f.self->request(q, timeout, enqueue_atom::value, make_unroll(2, 0));
  auto s = f.stats(q);
  CHECK(s.depth == 2);
  CHECK(s.waiting_producers == 1);
  std::vector<unroll> batch;
  f.self->request(q, timeout, dequeue_atom::value, int64_t{2})
      .receive([&](std::vector<unroll>& b) { batch = std::move(b); },
               [](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(batch.size() == 2);
  CHECK(batch[0].actor == 0);
  CHECK(batch[1].actor == 1);
  CHECK(batch[1].rewards.f32()[0] == 1.0f);
  third.receive([&](int64_t d) { CHECK(d == 1); }, [](caf::error& e) { FAIL(describe(e)); });
  s = f.stats(q);
  CHECK(s.enqueued == 3);
  CHECK(s.dequeued == 2);
  CHECK(s.depth == 1);
  CHECK(s.waiting_producers == 0);
}

TEST_CASE("trajectory_queue: a learner waits for a whole batch") {
  fixture f;
  auto q = spawn_trajectory_queue(f.sys, {4, -1, {}});
  auto pending = f.self->request(q, timeout, dequeue_atom::value, int64_t{3});
  for (int64_t a = 0; a < 3; ++a)
    f.self->request(q, timeout, enqueue_atom::value, make_unroll(a, 0))
        .receive([](int64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  pending.receive(
      [](std::vector<unroll>& b) {
        REQUIRE(b.size() == 3);
        CHECK(b[2].actor == 2);
      },
      [](caf::error& e) { FAIL(describe(e)); });
  CHECK(f.stats(q).waiting_consumers == 0);
}

TEST_CASE("trajectory_queue: unrolls older than max_policy_lag are dropped, in and out") {
  fixture f;
  auto q = spawn_trajectory_queue(f.sys, {8, 2, {}});
  f.self->send(q, version_atom::value, int64_t{10});
  int64_t answer = 0;
  f.self->request(q, timeout, enqueue_atom::value, make_unroll(0, 7))
      .receive([&](int64_t d) { answer = d; }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(answer == -1);  // 3 versions behind
  f.self->request(q, timeout, enqueue_atom::value, make_unroll(1, 8))
      .receive([&](int64_t d) { answer = d; }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(answer == 1);
  f.self->request(q, timeout, enqueue_atom::value, make_unroll(2, 10))
      .receive([](int64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  // The learners move on: the version-8 unroll is now too old.
  f.self->send(q, version_atom::value, int64_t{11});
  std::vector<unroll> batch;
  f.self->request(q, timeout, dequeue_atom::value, int64_t{1})
      .receive([&](std::vector<unroll>& b) { batch = std::move(b); },
               [](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(batch.size() == 1);
  CHECK(batch[0].actor == 2);
  auto s = f.stats(q);
  CHECK(s.dropped_stale == 2);
  CHECK(s.policy_version == 11);
  CHECK(s.depth == 0);
}

TEST_CASE("trajectory_queue: bad settings and impossible batches are refused") {
  fixture f;
  CHECK_THROWS_WITH_AS(spawn_trajectory_queue(f.sys, {0, -1, {}}),
                       "trajectory_queue: capacity must be >= 1, got 0", std::invalid_argument);
  CHECK_THROWS_AS(spawn_trajectory_queue(f.sys, {4, -2, {}}), std::invalid_argument);
  auto q = spawn_trajectory_queue(f.sys, {4, -1, {}});
  std::string error;
  f.self->request(q, timeout, dequeue_atom::value, int64_t{5})
      .receive([](std::vector<unroll>&) { FAIL("served"); },
               [&](caf::error& e) { error = describe(e); });
  CHECK(error == "trajectory_queue: a batch of 5 unrolls can never be served (capacity 4)");
}

TEST_CASE("an unroll survives serialization") {
  fixture f;
  auto u = make_unroll(3, 42);  // T = 2 steps of M = 3 envs, 4 features, 2 actions
  u.observations = tensor({3, 3, 4});
  u.observations.f32()[7] = 2.5f;
  u.terminated = tensor({2, 3}, dtype::i32);
  u.terminated.data<int32_t>()[4] = 1;
  u.truncated = tensor({2, 3}, dtype::i32);
  u.final_observations = tensor({2, 3, 4});
  u.behaviour_logits = tensor({2, 3, 2});
  std::vector<char> buf;
  caf::binary_serializer sink{f.sys, buf};
  REQUIRE_FALSE(inspect(sink, u));
  unroll back;
  caf::binary_deserializer source{f.sys, buf};
  REQUIRE_FALSE(inspect(source, back));
  CHECK(back.actor == 3);
  CHECK(back.policy_version == 42);
  CHECK(back.observations == u.observations);
  CHECK(back.actions == u.actions);
  CHECK(back.terminated == u.terminated);
  CHECK(back.behaviour_logits == u.behaviour_logits);
  CHECK(back.steps() == 2);
  CHECK(back.envs() == 3);
}

TEST_CASE("trajectory_queue: a malformed unroll is refused, naming what is wrong") {
  fixture f;
  const unroll_shape shape{2, 3, 4, 2};
  auto q = spawn_trajectory_queue(f.sys, {4, -1, shape});
  auto good = [] {
    unroll u;
    u.actor = 5;
    u.observations = tensor({3, 3, 4});
    u.actions = tensor({2, 3}, dtype::i32);
    u.rewards = tensor({2, 3});
    u.terminated = tensor({2, 3}, dtype::i32);
    u.truncated = tensor({2, 3}, dtype::i32);
    u.final_observations = tensor({2, 3, 4});
    u.behaviour_logits = tensor({2, 3, 2});
    return u;
  };
  CHECK(unroll_problem(good(), shape).empty());
  auto offer = [&](unroll u) {
    std::string error;
    f.self->request(q, timeout, enqueue_atom::value, std::move(u))
        .receive([](int64_t) {}, [&](caf::error& e) { error = describe(e); });
    return error;
  };
  CHECK(offer(good()).empty());
  auto wrong_shape = good();
  wrong_shape.rewards = tensor({2, 2});
  CHECK(offer(wrong_shape)
            .find("refused an unroll from actor 5: rewards has shape [2, 2] float32, "
                  "expected [2, 3] float32") != std::string::npos);
  auto bad_action = good();
  bad_action.actions.data<int32_t>()[4] = 2;
  CHECK(offer(bad_action).find("actions[4] is 2, expected a value in [0, 1]") != std::string::npos);
  auto bad_flag = good();
  bad_flag.terminated.data<int32_t>()[0] = 7;
  CHECK(offer(bad_flag).find("terminated[0] is 7") != std::string::npos);
  auto nan = good();
  nan.rewards.f32()[1] = std::nanf("");
  CHECK(offer(nan).find("rewards[1] is not a finite number") != std::string::npos);
  auto s = f.stats(q);
  CHECK(s.refused == 4);
  CHECK(s.enqueued == 1);
  CHECK_THROWS_AS(spawn_trajectory_queue(f.sys, {4, -1, {2, 0, 4, 2}}), std::invalid_argument);
}
