// replay_shard: inserts fill a ring that evicts the oldest, samples follow
// the priorities and carry the right transitions, ids and weights, priority
// updates move the draws and ignore evicted ids, below min_size a sample
// is empty, the rate limiter holds inserts until samples catch up, malformed inserts are refused
// naming the field; the messages survive CAF's serialization (they cross processes); and an
// rl_actor given shards acts epsilon-greedily and inserts prioritized n-step transitions into them
// in turn.
#include <doctest/doctest.h>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "actors/replay_shard.hpp"
#include "actors/rl_actor.hpp"
#include "actors/system_config.hpp"
#include "kernels/cpu_kernels.hpp"
#include "policy_fixtures.hpp"

using namespace troupe;

namespace {

constexpr auto timeout = std::chrono::seconds(10);
constexpr int64_t kObs = 3;

// n transitions numbered from `first`: every field holds its number, so a
// sample shows which transitions it drew.
transition_batch numbered(int64_t first, int64_t n, float priority) {
  transition_batch b;
  b.observations = tensor({n, kObs});
  b.next_observations = tensor({n, kObs});
  b.actions = tensor({n}, dtype::i32);
  b.returns = tensor({n});
  b.discounts = tensor({n});
  b.priorities = tensor({n});
  for (int64_t r = 0; r < n; ++r) {
    const auto v = static_cast<float>(first + r);
    for (int64_t j = 0; j < kObs; ++j) {
      b.observations.f32()[r * kObs + j] = v;
      b.next_observations.f32()[r * kObs + j] = v + 0.5f;
    }
    b.actions.data<int32_t>()[r] = static_cast<int32_t>((first + r) % 2);
    b.returns.f32()[r] = v;
    b.discounts.f32()[r] = 0.99f;
    b.priorities.f32()[r] = priority;
  }
  return b;
}

struct fixture {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  replay_shard_actor shard(int64_t capacity, double alpha = 1.0, double beta = 1.0,
                           int64_t min_size = 1) {
    replay_shard_config c;
    c.capacity = capacity;
    c.alpha = alpha;
    c.beta = beta;
    c.min_size = min_size;
    c.observation_size = kObs;
    c.actions = 2;
    c.seed = 1;
    return spawn_replay_shard(sys, c);
  }
  int64_t insert(const replay_shard_actor& s, transition_batch b) {
    int64_t size = -1;
    self->request(s, timeout, insert_atom::value, std::move(b))
        .receive([&](int64_t n) { size = n; }, [](caf::error& e) { FAIL(describe(e)); });
    return size;
  }
  replay_sample sample(const replay_shard_actor& s, int64_t n) {
    replay_sample out;
    self->request(s, timeout, sample_atom::value, n)
        .receive([&](replay_sample& x) { out = std::move(x); },
                 [](caf::error& e) { FAIL(describe(e)); });
    return out;
  }
  replay_stats stats(const replay_shard_actor& s) {
    replay_stats out;
    self->request(s, timeout, stats_atom::value)
        .receive([&](replay_stats& x) { out = x; }, [](caf::error& e) { FAIL(describe(e)); });
    return out;
  }
};

}  // namespace

TEST_CASE_FIXTURE(fixture, "replay_shard: a sample returns the transitions its ids name") {
  auto s = shard(16);
  CHECK(insert(s, numbered(0, 10, 1.0f)) == 10);
  auto smp = sample(s, 64);
  REQUIRE(smp.ids.size() == 64);
  for (int64_t k = 0; k < 64; ++k) {
    const int64_t id = smp.ids[static_cast<std::size_t>(k)];
    REQUIRE(id >= 0);
    REQUIRE(id < 10);
    const auto v = static_cast<float>(id);
    CHECK(smp.transitions.observations.f32()[k * kObs + 2] == v);
    CHECK(smp.transitions.next_observations.f32()[k * kObs] == v + 0.5f);
    CHECK(smp.transitions.returns.f32()[k] == v);
    CHECK(smp.transitions.actions.data<int32_t>()[k] == id % 2);
    CHECK(smp.transitions.discounts.f32()[k] == 0.99f);
    CHECK(smp.weights.f32()[k] == doctest::Approx(1.0));  // equal priorities
  }
  CHECK(stats(s).sampled == 64);
}

TEST_CASE_FIXTURE(fixture, "replay_shard: once full the oldest are evicted, never sampled") {
  auto s = shard(8);
  insert(s, numbered(0, 6, 1.0f));
  CHECK(insert(s, numbered(6, 6, 1.0f)) == 8);  // ids 4..11 held
  auto st = stats(s);
  CHECK(st.inserted == 12);
  CHECK(st.evicted == 4);
  CHECK(st.size == 8);
  auto smp = sample(s, 400);
  std::vector<int64_t> seen(12, 0);
  for (std::size_t k = 0; k < smp.ids.size(); ++k) {
    const int64_t id = smp.ids[k];
    REQUIRE(id >= 4);
    REQUIRE(id < 12);
    ++seen[static_cast<std::size_t>(id)];
    CHECK(smp.transitions.returns.f32()[k] == static_cast<float>(id));
  }
  for (int64_t id = 4; id < 12; ++id) CHECK(seen[static_cast<std::size_t>(id)] > 0);
}

TEST_CASE_FIXTURE(fixture,
                  "replay_shard: priority updates move the draws; evicted ids are ignored") {
  auto s = shard(4, 1.0, 1.0);
  insert(s, numbered(0, 4, 1.0f));
  // id 2 gets 9 times the others' priority: drawn 9/12 of the time.
  self->send(s, priority_atom::value, priority_update{{2, 0}, {9.0f, 1.0f}});
  auto smp = sample(s, 1200);
  int64_t twos = 0;
  for (std::size_t k = 0; k < smp.ids.size(); ++k) {
    twos += smp.ids[k] == 2;
    // weights: (min / p)^beta = 1/9 for id 2, 1 for the others.
    CHECK(smp.weights.f32()[k] == doctest::Approx(smp.ids[k] == 2 ? 1.0 / 9 : 1.0));
  }
  // Stratified draws: within a few of 900.
  CHECK(twos == doctest::Approx(900).epsilon(0.02));
  // Ids 0..3 are overwritten by 4..7: an update of id 2 no longer applies.
  insert(s, numbered(4, 4, 1.0f));
  self->send(s, priority_atom::value, priority_update{{2, 6}, {100.0f, 3.0f}});
  auto st = stats(s);
  CHECK(st.updated == 3);
  CHECK(st.stale_updates == 1);
  smp = sample(s, 600);
  int64_t sixes = 0;
  for (auto id : smp.ids) sixes += id == 6;
  CHECK(sixes == doctest::Approx(300).epsilon(0.03));  // 3 of 6
}

TEST_CASE_FIXTURE(fixture, "replay_shard: below min_size a sample is answered empty") {
  auto s = shard(32, 1.0, 1.0, 8);
  insert(s, numbered(0, 5, 1.0f));
  CHECK(sample(s, 4).ids.empty());
  CHECK(stats(s).sampled == 0);
  insert(s, numbered(5, 5, 1.0f));
  CHECK(sample(s, 4).ids.size() == 4);
}

TEST_CASE_FIXTURE(fixture, "replay_shard: malformed inserts are refused naming the field") {
  auto s = shard(8);
  auto expect_refused = [&](transition_batch b, const std::string& what) {
    std::string why;
    self->request(s, timeout, insert_atom::value, std::move(b))
        .receive([&](int64_t) { FAIL("accepted"); }, [&](caf::error& e) { why = describe(e); });
    CHECK_MESSAGE(why.find(what) != std::string::npos, why);
  };
  auto b = numbered(0, 2, 1.0f);
  b.actions.data<int32_t>()[1] = 2;
  expect_refused(b, "actions[1] is 2");
  b = numbered(0, 2, 1.0f);
  b.priorities.f32()[0] = -1.0f;
  expect_refused(b, "priorities[0]");
  b = numbered(0, 2, 1.0f);
  b.discounts.f32()[1] = 1.5f;
  expect_refused(b, "discounts[1]");
  b = numbered(0, 2, 1.0f);
  b.observations = tensor({2, kObs + 1});
  expect_refused(b, "observations has shape");
  b = numbered(0, 2, 1.0f);
  b.returns.f32()[0] = NAN;
  expect_refused(b, "returns[0] is not a finite number");
  auto st = stats(s);
  CHECK(st.refused == 5);
  CHECK(st.size == 0);
  CHECK_THROWS_AS(shard(0), std::invalid_argument);
  CHECK_THROWS_AS(shard(8, 0.6, 1.5), std::invalid_argument);
  CHECK_THROWS_AS(shard(8, 0.6, 0.4, 9), std::invalid_argument);
}

TEST_CASE_FIXTURE(fixture, "replay_shard: its messages survive serialization") {
  replay_sample x;
  x.transitions = numbered(3, 2, 0.5f);
  x.ids = {3, 4};
  x.weights = tensor({2});
  x.weights.f32()[1] = 0.25f;
  std::vector<char> buf;
  caf::binary_serializer out(sys, buf);
  REQUIRE(!out(x));
  replay_sample y;
  caf::binary_deserializer in(sys, buf);
  REQUIRE(!in(y));
  CHECK(y.ids == x.ids);
  CHECK(y.weights.f32()[1] == 0.25f);
  CHECK(y.transitions.returns.f32()[1] == 4.0f);
  CHECK(transition_problem(y.transitions, kObs, 2).empty());
}

TEST_CASE("rl_actor (Ape-X): epsilon 0 acts greedily; priorities are |TD| under its network") {
  kernels::init_cpu_kernels();
  rl_actor_compute c;
  const int64_t M = 3, T = 10, A = 2, O = 4;
  init_rl_actor_compute(c, "CartPole-v1", M, test::tiny_model(), 21, 4);
  c.epsilon = 0;
  episode_report eps;
  auto u = act_unroll(c, 0, 1, T, eps);
  const float* q = u.behaviour_logits.f32();
  for (int64_t i = 0; i < T * M; ++i)
    CHECK(u.actions.data<int32_t>()[i] == (q[i * A + 1] > q[i * A] ? 1 : 0));
  auto b = prioritized_transitions(c, u, 3, 0.9);
  CHECK(transition_problem(b, O, A).empty());
  std::vector<float> qn(A), v(1);
  for (int64_t i = 0; i < T * M; ++i) {
    c.net->forward(b.next_observations.f32() + i * O, 1, qn.data(), v.data());
    const double y = b.returns.f32()[i] + b.discounts.f32()[i] * std::max(qn[0], qn[1]);
    const double td = y - q[i * A + b.actions.data<int32_t>()[i]];
    CHECK(b.priorities.f32()[i] == doctest::Approx(std::abs(td) + 1e-3).epsilon(1e-4));
  }
}

namespace {

// (Spawned with an argument: CAF 0.17 dereferences a null argument tuple
// for a functor without arguments, which UBSan reports.)
rl_reports_actor::behavior_type quiet_coordinator(int) {
  return {
      [](episodes_atom, episode_report&) {},
      [](learned_atom, learner_report&) {},
      [](weights_atom, policy_weights&) {},
  };
}

}  // namespace

TEST_CASE_FIXTURE(fixture, "rl_actor (Ape-X): unrolls go to the shards in turn as transitions") {
  kernels::init_cpu_kernels();
  const int64_t M = 4, T = 8;
  std::vector<replay_shard_actor> shards;
  for (int64_t i = 0; i < 2; ++i) {
    replay_shard_config c;
    c.index = i;
    c.capacity = 4096;
    c.observation_size = 4;
    c.actions = 2;
    shards.push_back(spawn_replay_shard(sys, c));
  }
  rl_actor_config ac;
  ac.device = std::make_shared<cpu_device>("cpu:0");
  ac.env = "CartPole-v1";
  ac.envs = M;
  ac.unroll_length = T;
  ac.model = test::tiny_model();
  ac.seed = 3;
  ac.coordinator = sys.spawn(quiet_coordinator, 0);
  ac.replay = shards;
  ac.epsilon = 0.3;
  auto actor = spawn_rl_actor(sys, ac);
  auto net = create_policy_value_model(ac.model, 4, 2, 3);
  policy_weights w;
  for (const auto& var : net->variables()) w.values.push_back(var.value.clone());
  self->send(actor, weights_atom::value, w);
  self->send(actor, run_atom::value);
  // Wait (bounded) until both shards hold several unrolls.
  for (int k = 0;
       k < 1000 && (stats(shards[0]).inserted < 4 * T * M || stats(shards[1]).inserted < 4 * T * M);
       ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  self->send_exit(actor, caf::exit_reason::user_shutdown);
  auto a = stats(shards[0]), b = stats(shards[1]);
  CHECK(a.inserted >= 4 * T * M);
  CHECK(b.inserted >= 4 * T * M);
  CHECK(a.inserted % (T * M) == 0);  // whole unrolls
  CHECK(a.refused + b.refused == 0);
  // Round-robin: the shards differ by at most one unroll.
  CHECK(std::abs(a.inserted - b.inserted) <= T * M);
}

TEST_CASE_FIXTURE(fixture, "replay_shard: the rate limiter holds inserts until samples catch up") {
  replay_shard_config c;
  c.capacity = 64;
  c.min_size = 4;
  c.samples_per_insert = 2;
  c.observation_size = kObs;
  auto s = spawn_replay_shard(sys, c);
  CHECK(insert(s, numbered(0, 4, 1.0f)) == 4);  // up to min_size: no limit
  // 4 past min_size need 8 sampled: held. A plain send gets the answer as a message.
  self->send(s, insert_atom::value, numbered(4, 4, 1.0f));
  auto answered = [&] {
    bool got = false;
    self->receive([&](int64_t) { got = true; },
                  caf::after(std::chrono::milliseconds(100)) >> [] {});
    return got;
  };
  CHECK_FALSE(answered());
  CHECK(sample(s, 5).ids.size() == 5);
  CHECK_FALSE(answered());
  CHECK(sample(s, 3).ids.size() == 3);  // 8 sampled: released
  CHECK(answered());
  CHECK(stats(s).inserted == 8);
  CHECK_THROWS_AS(
      [&] {
        c.samples_per_insert = -1;
        spawn_replay_shard(sys, c);
      }(),
      std::invalid_argument);
}
