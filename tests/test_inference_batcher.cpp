// inference_batcher (actors/inference_batcher.hpp), central inference's
// path for the rl_actors of the server's own process: its batch rule (every
// acting actor, max_batch rows, max_wait), the replies against the server's
// batch function, weights, close(), an rl_actor's unrolls through it
// against the same actor's by message, and its batches on a discrete device
// (sim:0) against the host's.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "actors/inference_batcher.hpp"
#include "actors/inference_server.hpp"
#include "actors/rl_actor.hpp"
#include "actors/system_config.hpp"
#include "envs/policy_head.hpp"
#include "fixtures.hpp"
#include "kernels/cpu_kernels.hpp"
#include "policy_fixtures.hpp"

using namespace troupe;
using troupe::test::random_floats;
using troupe::test::tiny_model;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t job_seed = 5;

policy_head cartpole_head() {
  return envs::policy_head_for(envs::make_env("CartPole-v1", 1)->spec(), "auto");
}

// Weights of version `version` from a policy seeded `seed`.
policy_weights weights_of(uint64_t seed, int64_t version) {
  auto net = create_policy_value_model(tiny_model(), 4, cartpole_head(), seed);
  policy_weights w{version, {}};
  for (auto& v : net->variables()) w.values.push_back(v.value);
  return w;
}

// A batcher whose policy starts from seed 1 (weights come by offer_weights).
std::unique_ptr<inference_batcher> make_batcher(std::chrono::microseconds max_wait,
                                                int64_t max_batch = 4096) {
  kernels::init_cpu_kernels();
  inference_batcher::settings s;
  s.head = cartpole_head();
  s.seed = job_seed;
  s.observation_size = 4;
  s.max_batch = max_batch;
  s.max_wait = max_wait;
  return std::make_unique<inference_batcher>(s,
                                             create_policy_value_model(tiny_model(), 4, s.head, 1));
}

inference_request request_of(int64_t actor, int64_t step, int64_t rows, uint64_t noise) {
  inference_request r{actor, step, tensor::uninitialized({rows, 4})};
  auto x = random_floats(static_cast<std::size_t>(rows * 4), noise, 1.0);
  std::copy(x.begin(), x.end(), r.observations.f32());
  return r;
}

// `r`'s reply from the server's batch function alone, under weights `w`.
inference_reply alone(const inference_request& r, const policy_weights& w) {
  inference_compute c;
  c.net = create_policy_value_model(tiny_model(), 4, cartpole_head(), 1);
  install_policy_weights(*c.net, w);
  return infer_batch(c, cartpole_head(), job_seed, {r}, w.version).at(0);
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && a.type() == b.type() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// infer on a thread of its own, as an acting actor's device thread.
std::future<inference_reply> ask(inference_batcher& b, const inference_request& r) {
  return std::async(std::launch::async, [&b, &r] {
    inference_batcher::acting acting(b);
    return b.infer(r);
  });
}

}  // namespace

TEST_CASE("inference_batcher: two acting actors' requests run as one batch, each its own reply") {
  auto b = make_batcher(600s);  // only "every acting actor asked" runs it
  const auto w = weights_of(9, 3);
  b->offer_weights(w);
  const auto r0 = request_of(0, 0, 5, 1), r1 = request_of(1, 0, 7, 2);
  inference_batcher::acting both_act(*b);  // a second actor acts until r1 comes
  auto f0 = ask(*b, r0);
  CHECK(f0.wait_for(100ms) == std::future_status::timeout);  // it waits for actor 1
  const auto got1 = b->infer(r1);                            // as actor 1, acting since before
  REQUIRE(f0.wait_for(20s) == std::future_status::ready);
  const auto got0 = f0.get();
  const auto s = b->stats();
  CHECK(s.batches == 1);
  CHECK(s.rows == 12);
  CHECK(s.overdue_batches == 0);
  CHECK(s.in_process_batches == 1);
  // The replies are what each request gets alone: the rows of a forward do
  // not depend on the batch, and each actor samples from its own stream.
  for (const auto& [got, r] : {std::pair{&got0, &r0}, std::pair{&got1, &r1}}) {
    const auto want = alone(*r, w);
    CHECK(got->policy_version == 3);
    CHECK(same_bits(got->outputs, want.outputs));
    CHECK(same_bits(got->actions, want.actions));
  }
}

TEST_CASE("inference_batcher: an actor that is not acting holds no batch back") {
  auto b = make_batcher(600s);
  b->offer_weights(weights_of(9, 1));
  const auto r = request_of(0, 0, 3, 1);
  // Actor 1 exists but offers its unroll elsewhere: actor 0 alone is acting.
  auto f = ask(*b, r);
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  CHECK(f.get().actions.numel() == 3);
  CHECK(b->stats().overdue_batches == 0);
}

TEST_CASE("inference_batcher: an acting actor that does not ask holds the batch max_wait") {
  auto b = make_batcher(100ms);
  b->offer_weights(weights_of(9, 1));
  inference_batcher::acting silent(*b);
  const auto r = request_of(0, 0, 3, 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto f = ask(*b, r);
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
  CHECK(f.get().outputs.numel() == 3 * 2);
  CHECK(b->stats().overdue_batches == 1);
}

TEST_CASE("inference_batcher: max_batch rows run at once, the rest in the next batch") {
  auto b = make_batcher(600s, 8);
  b->offer_weights(weights_of(9, 1));
  inference_batcher::acting others(*b);  // an actor that never asks: only size runs a batch
  const auto big = request_of(0, 0, 8, 1);
  auto f = ask(*b, big);
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  CHECK(f.get().actions.numel() == 8);
  CHECK(b->stats().batches == 1);
}

TEST_CASE("inference_batcher: requests wait for the first weights, then run with them") {
  auto b = make_batcher(1ms);
  const auto r = request_of(0, 0, 4, 1);
  auto f = ask(*b, r);
  CHECK(f.wait_for(200ms) == std::future_status::timeout);
  CHECK(b->version() == -1);
  const auto w = weights_of(9, 7);
  b->offer_weights(w);
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  const auto got = f.get();
  CHECK(got.policy_version == 7);
  CHECK(same_bits(got.outputs, alone(r, w).outputs));
  b->offer_weights(weights_of(10, 6));  // older: ignored
  CHECK(b->version() == 7);
}

TEST_CASE("inference_batcher: close ends every wait with its reason, and later requests") {
  auto b = make_batcher(600s);
  b->offer_weights(weights_of(9, 1));
  inference_batcher::acting silent(*b);
  const auto r = request_of(0, 0, 2, 1);
  auto f = ask(*b, r);
  CHECK(f.wait_for(100ms) == std::future_status::timeout);
  b->close("the inference server stopped (test)");
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  CHECK_THROWS_WITH(f.get(), "the inference server stopped (test)");
  CHECK_THROWS_WITH(b->infer(r), "the inference server stopped (test)");
  CHECK(b->stats().batches == 0);
}

TEST_CASE("inference_batcher: a request of the wrong shape is refused, naming it") {
  auto b = make_batcher(1ms);
  b->offer_weights(weights_of(9, 1));
  inference_request bad{2, 0, tensor({3, 5})};
  CHECK_THROWS_WITH(b->infer(bad),
                    "rl_actor 2: observations of shape [3, 5] float32, expected [M, 4] float32");
}

TEST_CASE("inference_batcher: the server's own batches and the actors' share the policy") {
  auto b = make_batcher(1ms);
  const auto w = weights_of(9, 2);
  b->offer_weights(w);
  const auto by_message = request_of(4, 0, 3, 1);
  const auto replies = b->infer_now({&by_message}, true);
  REQUIRE(replies.size() == 1);
  CHECK(same_bits(replies[0].actions, alone(by_message, w).actions));
  const auto asked = request_of(0, 0, 2, 3);
  auto f = ask(*b, asked);
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  CHECK(f.get().policy_version == 2);
  const auto s = b->stats();
  CHECK(s.batches == 2);
  CHECK(s.rows == 5);
  CHECK(s.overdue_batches == 1);
  CHECK(s.in_process_batches == 1);  // the actor's; infer_now's came by message
}

namespace {

// Takes unrolls, keeping the first `keep` of each actor.
struct kept_unrolls {
  std::mutex mu;
  std::map<int64_t, std::vector<unroll>> by_actor;
  std::size_t keep = 3;
};

trajectory_queue_actor::behavior_type keeping_queue(trajectory_queue_actor::pointer,
                                                    kept_unrolls* kept) {
  return {[kept](enqueue_atom, unroll& u) -> int64_t {
            std::lock_guard<std::mutex> guard(kept->mu);
            auto& mine = kept->by_actor[u.actor];
            if (mine.size() < kept->keep) mine.push_back(std::move(u));
            return 0;
          },
          [](dequeue_atom, int64_t) -> std::vector<unroll> { return {}; },
          [](version_atom, int64_t) {}, [](stats_atom) -> queue_stats { return {}; }};
}

// (An argument: CAF 0.17 dereferences a null argument tuple for a function
// actor spawned without one, which UBSan reports.)
rl_reports_actor::behavior_type ignoring_coordinator(rl_reports_actor::pointer, int) {
  return {[](episodes_atom, episode_report&) {}, [](learned_atom, learner_report&) {},
          [](weights_atom, policy_weights&) {}};
}

struct central_run {
  std::map<int64_t, std::vector<unroll>> unrolls;  // by actor
  inference_stats stats;                           // the server's
};

// The first unrolls of 2 rl_actors (M = 6, T = 8) through a fresh server,
// asked through its batcher or by message.
central_run central_unrolls(bool in_process) {
  system_config cfg;
  caf::actor_system sys{cfg};
  kept_unrolls kept;
  auto queue = sys.spawn(keeping_queue, &kept);
  auto coordinator = sys.spawn(ignoring_coordinator, 0);
  inference_server_config ic;
  ic.device = std::make_shared<cpu_device>("inference_server");
  ic.model = tiny_model();
  ic.observation_size = 4;
  ic.head = cartpole_head();
  ic.seed = job_seed;
  ic.actors = 2;
  auto server = spawn_inference_server(sys, ic);
  caf::anon_send(server, weights_atom::value, weights_of(9, 1));
  std::vector<rl_actor_actor> actors;
  for (int64_t i = 0; i < 2; ++i) {
    rl_actor_config ac;
    ac.index = i;
    ac.device = std::make_shared<cpu_device>("cpu:" + std::to_string(i));
    ac.envs = 6;
    ac.unroll_length = 8;
    ac.model = tiny_model();
    ac.seed = job_seed;
    ac.queue = queue;
    ac.coordinator = coordinator;
    ac.inference = server;
    ac.inference_in_process = in_process;
    actors.push_back(spawn_rl_actor(sys, ac));
    caf::anon_send(actors.back(), run_atom::value);
  }
  const auto until = std::chrono::steady_clock::now() + 60s;
  auto done = [&] {
    std::lock_guard<std::mutex> guard(kept.mu);
    return kept.by_actor.size() == 2 && kept.by_actor[0].size() == kept.keep &&
           kept.by_actor[1].size() == kept.keep;
  };
  while (!done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  central_run run;
  caf::scoped_actor self{sys};
  self->request(server, 20s, stats_atom::value)
      .receive([&](inference_stats& s) { run.stats = s; }, [](caf::error&) {});
  for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  for (auto h : {caf::actor_cast<caf::actor>(server), caf::actor_cast<caf::actor>(queue),
                 caf::actor_cast<caf::actor>(coordinator)})
    caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  std::lock_guard<std::mutex> guard(kept.mu);
  run.unrolls = kept.by_actor;
  return run;
}

}  // namespace

TEST_CASE("central inference: an rl_actor's unrolls through the batcher are those by message") {
  kernels::init_cpu_kernels();
  const auto batched_run = central_unrolls(true);
  const auto by_message_run = central_unrolls(false);
  CHECK(batched_run.stats.in_process_batches == batched_run.stats.batches);
  CHECK(batched_run.stats.batches > 0);
  CHECK(by_message_run.stats.in_process_batches == 0);
  CHECK(by_message_run.stats.batches > 0);
  const auto& batched = batched_run.unrolls;
  const auto& by_message = by_message_run.unrolls;
  for (int64_t a = 0; a < 2; ++a) {
    CAPTURE(a);
    REQUIRE(batched.at(a).size() == 3);
    REQUIRE(by_message.at(a).size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      const auto &x = batched.at(a)[k], &y = by_message.at(a)[k];
      CHECK(x.policy_version == 1);
      CHECK(same_bits(x.observations, y.observations));
      CHECK(same_bits(x.actions, y.actions));
      CHECK(same_bits(x.behaviour_logits, y.behaviour_logits));
      CHECK(same_bits(x.rewards, y.rewards));
    }
  }
}

TEST_CASE("inference_batcher on sim:0: its batches on the device answer as on the host") {
  kernels::init_cpu_kernels();
  inference_batcher::settings s;
  s.head = cartpole_head();
  s.seed = job_seed;
  s.observation_size = 4;
  s.max_wait = 600s;
  s.device = "sim:0";
  s.model = tiny_model();
  inference_batcher b(s, create_policy_value_model(tiny_model(), 4, s.head, 1));
  const auto w = weights_of(9, 2);
  b.offer_weights(w);
  const auto r0 = request_of(0, 0, 5, 1), r1 = request_of(1, 0, 3, 2);
  inference_batcher::acting actor1(b);
  auto f0 = ask(b, r0);
  CHECK(f0.wait_for(100ms) == std::future_status::timeout);  // it waits for actor 1
  const auto got1 = b.infer(r1);
  REQUIRE(f0.wait_for(20s) == std::future_status::ready);
  const auto got0 = f0.get();
  CHECK(same_bits(got0.outputs, alone(r0, w).outputs));
  CHECK(same_bits(got0.actions, alone(r0, w).actions));
  CHECK(same_bits(got1.actions, alone(r1, w).actions));
  // Newer weights are uploaded before the next batch; the server's own
  // batch runs on the device too.
  const auto w2 = weights_of(10, 3);
  b.offer_weights(w2);
  const auto by_message = request_of(4, 0, 2, 5);
  const auto replies = b.infer_now({&by_message}, false);
  CHECK(replies.at(0).policy_version == 3);
  CHECK(same_bits(replies.at(0).outputs, alone(by_message, w2).outputs));
  CHECK(b.stats().batches == 2);
}
