// actor_learner: the learner's gradients against finite differences, V-trace
// targets at episode ends, data-parallel learners against one learner, the
// rl_actor's unrolls against a replay of its environments, the config rules,
// and whole jobs: CartPole solved, an actor lost on the way, a learner lost,
// a checkpoint resumed.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "actors/fault_injection.hpp"
#include "actors/learner.hpp"
#include "actors/reducer.hpp"
#include "actors/rl_actor.hpp"
#include "actors/system_config.hpp"
#include "actors/trajectory_queue.hpp"
#include "checkpoint/checkpoint.hpp"
#include "envs/env.hpp"
#include "fixtures.hpp"
#include "kernels/cpu_kernels.hpp"
#include "models/impala.hpp"
#include "models/random.hpp"
#include "policy_fixtures.hpp"
#include "runtime/job.hpp"

using namespace troupe;
using troupe::test::metrics_lines;
using troupe::test::random_unroll;
using troupe::test::tiny_model;

namespace {

constexpr auto timeout = std::chrono::seconds(30);

// The loss with fixed V-trace targets (the targets are constants of the
// gradient), divided by the global batch.
double fixed_target_loss(policy_value_model& net, const impala_workspace& ws, int64_t n, int64_t A,
                         const impala_settings& s, int64_t global) {
  std::vector<float> logits(static_cast<std::size_t>(n * A)), values(static_cast<std::size_t>(n));
  std::vector<float> dl(logits.size()), dv(values.size());
  net.forward(ws.obs.data(), n, logits.data(), values.data());
  auto l = impala_loss_and_gradients(logits.data(), values.data(), ws.actions.data(), ws.vs.data(),
                                     ws.advantages.data(), n, A, s.baseline_cost, s.entropy_cost,
                                     dl.data(), dv.data());
  return l.total / static_cast<double>(global);
}

}  // namespace

TEST_CASE("impala: the learner's gradients match finite differences of its loss") {
  kernels::init_cpu_kernels();
  const int64_t T = 4, M = 3, O = 4, A = 3;
  auto net = create_policy_value_model(tiny_model(), O, A, 7);
  std::vector<unroll> batch{random_unroll(0, T, M, O, A, 1), random_unroll(1, T, M, O, A, 2)};
  impala_settings s;
  s.discount = 0.9;
  s.baseline_cost = 0.5;
  s.entropy_cost = 0.05;
  impala_workspace ws;
  auto grads = net->make_gradients();
  const int64_t global = 2 * T * M;
  auto fig = impala_gradients(*net, batch, s, global, 3, grads, ws);
  CHECK(fig.samples == global);
  CHECK(fig.lag_max == 3);
  const int64_t n = 2 * T * M;
  const int checked = test::check_finite_differences(
      *net, grads, [&] { return fixed_target_loss(*net, ws, n, A, s, global); });
  CHECK(checked > 20);
}

TEST_CASE("impala: on policy, targets stop at a termination and bootstrap at a truncation") {
  kernels::init_cpu_kernels();
  const int64_t T = 4, M = 3, O = 4, A = 2;
  auto net = create_policy_value_model(tiny_model(), O, A, 11);
  std::vector<unroll> batch{random_unroll(0, T, M, O, A, 3, net.get())};
  const auto& u = batch[0];
  impala_settings s;
  s.discount = 0.9;
  impala_workspace ws;
  auto grads = net->make_gradients();
  impala_gradients(*net, batch, s, T * M, 0, grads, ws);
  // On policy the importance weights are 1: vs_t = r_t + gamma * vs_{t+1}
  // inside an episode; at a termination vs_t = r_t.
  const float* r = u.rewards.f32();
  CHECK(ws.vs[1 * M + 0] == doctest::Approx(r[1 * M + 0]).epsilon(1e-5));
  CHECK(ws.vs[0 * M + 0] == doctest::Approx(r[0] + 0.9 * ws.vs[1 * M + 0]).epsilon(1e-5));
  // At a truncation the target bootstraps from the final observation's value.
  const int64_t i = (T - 2) * M + (M - 1);
  std::vector<float> logits(A), value(1);
  net->forward(u.final_observations.f32() + i * O, 1, logits.data(), value.data());
  CHECK(ws.vs[static_cast<std::size_t>(i)] == doctest::Approx(r[i] + 0.9 * value[0]).epsilon(1e-4));
  // After the truncation a new episode starts: its step does not look back.
  const int64_t j = (T - 3) * M + (M - 1);
  CHECK(ws.vs[static_cast<std::size_t>(j)] ==
        doctest::Approx(r[j] + 0.9 * ws.vs[static_cast<std::size_t>(i)]).epsilon(1e-4));
}

TEST_CASE("impala: two halves of a batch sum to the whole batch's gradients") {
  kernels::init_cpu_kernels();
  const int64_t T = 5, M = 2, O = 4, A = 2;
  auto net = create_policy_value_model(tiny_model(), O, A, 5);
  std::vector<unroll> all;
  for (int64_t k = 0; k < 4; ++k) all.push_back(random_unroll(k, T, M, O, A, 10 + k));
  impala_settings s;
  impala_workspace ws;
  const int64_t global = 4 * T * M;
  auto whole = net->make_gradients();
  impala_gradients(*net, all, s, global, 0, whole, ws);
  auto a = net->make_gradients(), b = net->make_gradients();
  impala_gradients(*net, {all[0], all[1]}, s, global, 0, a, ws);
  impala_gradients(*net, {all[2], all[3]}, s, global, 0, b, ws);
  for (std::size_t v = 0; v < whole.size(); ++v)
    for (int64_t i = 0; i < whole[v].value.numel(); ++i)
      CHECK(a[v].value.f32()[i] + b[v].value.f32()[i] ==
            doctest::Approx(whole[v].value.f32()[i]).epsilon(1e-4).scale(1e-6));
}

TEST_CASE("impala: a malformed unroll is refused naming it") {
  auto net = create_policy_value_model(tiny_model(), 4, 2, 5);
  auto u = random_unroll(7, 3, 2, 4, 2, 1);
  auto bad = u;
  bad.rewards = tensor({3, 1});
  impala_workspace ws;
  auto grads = net->make_gradients();
  CHECK_THROWS_WITH(impala_gradients(*net, {u, bad}, {}, 12, 0, grads, ws),
                    doctest::Contains("unroll 1 (actor 7): rewards has shape [3, 1]"));
  auto wrong_obs = random_unroll(2, 3, 2, 5, 2, 1);
  CHECK_THROWS_WITH(impala_gradients(*net, {wrong_obs}, {}, 6, 0, grads, ws),
                    doctest::Contains("observations of size 5 do not fit"));
}

TEST_CASE("clip_global_norm scales gradients down to the norm, never up") {
  std::vector<named_tensor> g{{"a", tensor::from<float>({2}, {3, 0})},
                              {"b", tensor::from<float>({1}, {4})}};
  CHECK(clip_global_norm(g, 10) == doctest::Approx(5));
  CHECK(g[0].value.f32()[0] == 3);
  CHECK(clip_global_norm(g, 1) == doctest::Approx(5));
  CHECK(g[0].value.f32()[0] == doctest::Approx(0.6));
  CHECK(g[1].value.f32()[0] == doctest::Approx(0.8));
  CHECK(clip_global_norm(g, 0) == doctest::Approx(1));  // 0: no clipping
}

TEST_CASE("rl_actor: an unroll is its environments replayed with its actions") {
  kernels::init_cpu_kernels();
  rl_actor_compute c;
  const int64_t M = 4, T = 60;
  init_rl_actor_compute(c, "CartPole-v1", M, tiny_model(), 99, 3);
  episode_report eps;
  auto u = act_unroll(c, 2, 5, T, eps);
  CHECK(u.actor == 2);
  CHECK(u.policy_version == 5);
  CHECK(u.observations.shape() == shape_t{T + 1, M, 4});
  CHECK(u.behaviour_logits.shape() == shape_t{T, M, 2});
  CHECK(eps.env_steps == T * M);
  // Replay: the same seed and actions give the same transitions.
  auto env = envs::make_env("CartPole-v1", M);
  std::vector<float> obs(M * 4), fin(M * 4);
  std::vector<float> rew(M);
  std::vector<uint8_t> term(M), trunc(M);
  std::vector<double> ret(M);
  std::vector<int64_t> len(M);
  env->reset(99, obs.data());
  int64_t ended = 0;
  auto policy = create_policy_value_model(tiny_model(), 4, 2, 3);
  std::vector<float> logits(M * 2), values(M);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < M * 4; ++k) REQUIRE(u.observations.f32()[t * M * 4 + k] == obs[k]);
    policy->forward(obs.data(), M, logits.data(), values.data());
    for (int64_t k = 0; k < M * 2; ++k) CHECK(u.behaviour_logits.f32()[t * M * 2 + k] == logits[k]);
    envs::step_output out{obs.data(), rew.data(), term.data(), trunc.data(),
                          fin.data(), ret.data(), len.data()};
    env->step(u.actions.data<int32_t>() + t * M, out);
    for (int64_t m = 0; m < M; ++m) {
      CHECK(u.rewards.f32()[t * M + m] == rew[m]);
      CHECK(u.terminated.data<int32_t>()[t * M + m] == term[m]);
      CHECK(u.truncated.data<int32_t>()[t * M + m] == trunc[m]);
      if (term[m] || trunc[m]) {
        ++ended;
        for (int64_t k = 0; k < 4; ++k)
          CHECK(u.final_observations.f32()[(t * M + m) * 4 + k] == fin[m * 4 + k]);
      }
    }
  }
  CHECK(ended > 0);  // a random policy ends CartPole episodes within 60 steps
  CHECK(static_cast<int64_t>(eps.returns.size()) == ended);
  for (int64_t k = 0; k < M * 4; ++k) CHECK(u.observations.f32()[T * M * 4 + k] == obs[k]);
}

namespace {

// The versions of the weights the learners published, in order.
struct published_versions {
  std::mutex lock;
  std::vector<int64_t> versions;
};

// Stands in for the coordinator: remembers learner 0's version and the
// versions of the weights published to it.
struct fake_coordinator_state {
  std::shared_ptr<std::atomic<int64_t>> version;
  std::shared_ptr<published_versions> published;
};
rl_reports_actor::behavior_type fake_coordinator(
    rl_reports_actor::stateful_pointer<fake_coordinator_state> self,
    std::shared_ptr<std::atomic<int64_t>> version, std::shared_ptr<published_versions> published) {
  self->state.version = std::move(version);
  self->state.published = std::move(published);
  return {
      [](episodes_atom, episode_report&) {},
      [self](learned_atom, learner_report& r) {
        if (r.learner == 0) *self->state.version = r.version;
      },
      [self](weights_atom, policy_weights& w) {
        std::lock_guard<std::mutex> guard(self->state.published->lock);
        self->state.published->versions.push_back(w.version);
      },
  };
}

// `learners` data-parallel learners over one queue, a reducer group and a
// stand-in coordinator; fed one update's unrolls at a time (update u trains
// on unrolls B*u .. B*u+B-1 whatever the number of learners).
struct learner_rig {
  static constexpr int64_t T = 5, M = 4, O = 4, A = 2, B = 2;
  caf::actor_system& sys;
  caf::scoped_actor self;
  int64_t learners;
  std::shared_ptr<std::atomic<int64_t>> version = std::make_shared<std::atomic<int64_t>>(0);
  rl_reports_actor coord;
  trajectory_queue_actor queue;
  std::vector<reducer_actor> reducers;
  std::vector<learner_actor> ls;

  learner_rig(caf::actor_system& s, int64_t n, int64_t weights_every,
              std::shared_ptr<published_versions> published)
      : sys(s), self(s), learners(n) {
    coord = sys.spawn(fake_coordinator, version, std::move(published));
    queue = spawn_trajectory_queue(sys, {B * 64, -1, {}});
    auto device = std::make_shared<cpu_device>("cpu:0");
    if (learners > 1) reducers = spawn_reducer_group(sys, static_cast<int>(learners), {});
    for (int64_t l = 0; l < learners; ++l) {
      learner_config lc;
      lc.index = l;
      lc.learners = learners;
      lc.device = device;
      lc.model = tiny_model();
      lc.observation_size = O;
      lc.actions = A;
      lc.optimizer.kind = "adam";
      lc.optimizer.learning_rate = 0.01;
      lc.seed = 9;
      lc.grad_clip = 0.05;  // active: clipping must see the reduced gradients
      lc.batch_unrolls = B / learners;
      lc.global_samples = B * T * M;
      lc.queue = queue;
      if (!reducers.empty()) lc.reducer = reducers[static_cast<std::size_t>(l)];
      lc.coordinator = coord;
      lc.weights_every = weights_every;
      ls.push_back(spawn_learner(sys, lc));
    }
    for (auto& l : ls) self->send(l, run_atom::value);
  }
  ~learner_rig() {
    for (auto& l : ls) self->send_exit(l, caf::exit_reason::user_shutdown);
    for (auto& r : reducers) self->send_exit(r, caf::exit_reason::user_shutdown);
    self->send_exit(queue, caf::exit_reason::user_shutdown);
    self->send_exit(coord, caf::exit_reason::user_shutdown);
  }
  int64_t waiting() {
    int64_t n = 0;
    self->request(queue, timeout, stats_atom::value)
        .receive([&](queue_stats& q) { n = q.waiting_consumers; },
                 [](caf::error& e) { FAIL(describe(e)); });
    return n;
  }
  // Update u's unrolls, once update u - 1 is done and every learner waits.
  void feed(int64_t u) {
    for (int i = 0; i < 10000 && (*version < u || waiting() < learners); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(waiting() == learners);
    for (int64_t k = B * u; k < B * (u + 1); ++k)
      self->request(queue, timeout, enqueue_atom::value, random_unroll(k, T, M, O, A, 40 + k))
          .receive([](int64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  }
  void wait_for_version(int64_t v) {
    for (int i = 0; i < 10000 && *version < v; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(*version == v);
  }
  // Every learner's weights, checked equal; learner 0's.
  std::vector<tensor> weights(int64_t expect_version) {
    std::vector<tensor> out;
    for (auto& l : ls)
      self->request(l, timeout, weights_atom::value)
          .receive(
              [&](policy_weights& w) {
                CHECK(w.version == expect_version);
                if (out.empty()) {
                  out = w.values;
                } else {  // every learner holds the same weights
                  for (std::size_t v = 0; v < out.size(); ++v) CHECK(w.values[v] == out[v]);
                }
              },
              [](caf::error& e) { FAIL(describe(e)); });
    return out;
  }
};

// The weights of learner 0 after `updates` updates of `learners`
// data-parallel learners over the same unrolls, publishing every
// `weights_every` updates (rl.weights_every) to `published`.
std::vector<tensor> train_learners(int64_t learners, int64_t updates, int64_t weights_every = 1,
                                   std::shared_ptr<published_versions> published = nullptr) {
  if (!published) published = std::make_shared<published_versions>();
  system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<tensor> out;
  {
    learner_rig rig(sys, learners, weights_every, published);
    for (int64_t u = 0; u < updates; ++u) rig.feed(u);
    rig.wait_for_version(updates);
    out = rig.weights(updates);
  }
  sys.await_all_actors_done();
  return out;
}

}  // namespace

TEST_CASE("learners: two data-parallel learners train as one learner on the whole batch") {
  kernels::init_cpu_kernels();
  auto one = train_learners(1, 3);
  auto two = train_learners(2, 3);
  REQUIRE(one.size() == two.size());
  for (std::size_t v = 0; v < one.size(); ++v)
    for (int64_t i = 0; i < one[v].numel(); ++i)
      CHECK(two[v].f32()[i] == doctest::Approx(one[v].f32()[i]).epsilon(1e-4).scale(1e-5));
}

TEST_CASE("learners: rl.weights_every K publishes the weights after every K-th update only") {
  kernels::init_cpu_kernels();
  auto every = std::make_shared<published_versions>();
  train_learners(1, 5, 1, every);
  auto second = std::make_shared<published_versions>();
  train_learners(2, 5, 2, second);
  // Learner 0 publishes; the weights of update 4 reach the coordinator
  // before the report of update 5 that ends the run.
  CHECK(every->versions.size() >= 4);
  CHECK(std::vector<int64_t>(every->versions.begin(), every->versions.begin() + 4) ==
        std::vector<int64_t>{1, 2, 3, 4});
  CHECK(second->versions == std::vector<int64_t>{2, 4});
}

// rl.population with rl.learners 2: a member's learners are each sent the
// exploit, and take it after the first update whose all-reduce counts both
// holding it, whenever each got it, so they stay equal.
TEST_CASE("learners: a member's two learners take an exploit after the same update") {
  kernels::init_cpu_kernels();
  system_config cfg;
  caf::actor_system sys{cfg};
  {
    learner_rig rig(sys, 2, 1, std::make_shared<published_versions>());
    for (int64_t u = 0; u < 2; ++u) rig.feed(u);
    rig.wait_for_version(2);
    // The exploit: the state of another member (here: random variables and
    // slots at optimizer step 7), a new learning rate.
    model_state ms;
    rig.self->request(rig.ls[0], timeout, state_atom::value)
        .receive([&](model_state& s) { ms = std::move(s); },
                 [](caf::error& e) { FAIL(describe(e)); });
    test::scramble_state(ms, 3);
    const member_hyperparameters hp{0.02, 0.01};
    // Learner 1 gets it first: update 2 counts one holder, so nobody takes it.
    auto to_1 = rig.self->request(rig.ls[1], timeout, exploit_atom::value, ms, hp);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    rig.feed(2);
    rig.wait_for_version(3);
    {
      const auto w = rig.weights(3);  // equal, and not the exploit's
      CHECK(w[0] != ms.variables[0].value);
    }
    // Learner 0 gets it while waiting for a batch: it holds it too, and both
    // take it after update 3.
    auto to_0 = rig.self->request(rig.ls[0], timeout, exploit_atom::value, ms, hp);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    rig.feed(3);
    for (auto* answer : {&to_0, &to_1})
      answer->receive([](int64_t version) { CHECK(version == 4); },
                      [](caf::error& e) { FAIL(describe(e)); });
    for (auto& l : rig.ls)
      rig.self->request(l, timeout, state_atom::value)
          .receive(
              [&](model_state& s) {
                REQUIRE(s.variables.size() == ms.variables.size());
                for (std::size_t i = 0; i < s.variables.size(); ++i)
                  CHECK(s.variables[i].value == ms.variables[i].value);
                REQUIRE(s.slots.size() == ms.slots.size());
                for (std::size_t i = 0; i < s.slots.size(); ++i)
                  CHECK(s.slots[i].value == ms.slots[i].value);
              },
              [](caf::error& e) { FAIL(describe(e)); });
    // Training goes on from it in lockstep.
    rig.feed(4);
    rig.wait_for_version(5);
    rig.weights(5);
  }
  sys.await_all_actors_done();
}

TEST_CASE("actor_learner: CartPole is solved, with the figures users look for") {
  test::temp_dir tmp;
  auto c = test::quiet_example_job("cartpole_impala.json", tmp / "run");
  job_options o;
  auto s = run_job(c, o);
  CHECK(s["strategy"] == "actor_learner");
  CHECK(s["solved"] == true);
  CHECK(s["env_steps"].get<int64_t>() >= s["env_steps_to_solve"].get<int64_t>());
  CHECK(s["time_to_solve_seconds"].get<double>() > 0);
  CHECK(s["env_steps_per_second"].get<double>() > 0);
  auto lines = metrics_lines(tmp / "run", "train");
  REQUIRE(!lines.empty());
  // The returns the lines report are CartPole-v1's (at most 500 a
  // episode), their counts grow, and the summary comes after the last line.
  int64_t env_steps = 0, episodes = 0;
  for (const auto& l : lines) {
    CHECK(l["mean_return_100"].get<double>() >= 0);
    CHECK(l["mean_return_100"].get<double>() <= 500);
    CHECK(l["env_steps"].get<int64_t>() >= env_steps);
    CHECK(l["episodes"].get<int64_t>() >= episodes);
    env_steps = l["env_steps"].get<int64_t>();
    episodes = l["episodes"].get<int64_t>();
  }
  CHECK(s["env_steps"].get<int64_t>() >= env_steps);
  CHECK(s["episodes"].get<int64_t>() >= episodes);
  CHECK(s["mean_return_100"].get<double>() <= 500);
  CHECK(s["best_mean_return_100"].get<double>() >= s["mean_return_100"].get<double>());
  for (auto key : {"mean_return_100", "env_steps_per_second", "updates_per_second",
                   "samples_per_second", "policy_lag_mean", "policy_lag_max", "queue_depth"})
    CHECK(lines.back().contains(key));
  // The checkpoint at the end holds the policy and the optimizer's slots.
  auto snap = checkpoint::load(s["checkpoint"].get<std::string>());
  CHECK(snap.meta.strategy == "actor_learner");
  CHECK(snap.meta.step == s["updates"].get<int64_t>());
  CHECK(snap.variables.size() == 8);
  CHECK(!snap.slots.empty());
}

TEST_CASE("actor_learner: a lost rl_actor is logged and the job still solves") {
  test::temp_dir tmp;
  auto c = test::quiet_example_job("cartpole_impala.json", tmp / "run");
  c.rl.actors = 3;
  job_options o;
  // rl_actor 1 fails after 20 unrolls
  o.faults = inject_faults(fault_injection{}.fail_replica_at(1, 20));
  auto s = run_job(c, o);
  CHECK(s["solved"] == true);
  CHECK(s["actors"] == 3);
  CHECK(s["actors_live"] == 2);
  auto lost = metrics_lines(tmp / "run", "actor_lost");
  REQUIRE(lost.size() == 1);
  CHECK(lost[0]["actor"] == 1);
  CHECK(lost[0]["cause"].get<std::string>().find("rl_actor 1") != std::string::npos);
}

TEST_CASE("actor_learner: a lost learner ends the job naming it") {
  test::temp_dir tmp;
  auto c = test::quiet_example_job("cartpole_impala.json", tmp / "run");
  c.rl.learners = 2;
  job_options o;
  o.faults = inject_faults(fault_injection{}.fail_learner_at(1, 5));
  CHECK_THROWS_WITH_AS(run_job(c, o), doctest::Contains("learner 1 stopped"), job_error);
}

TEST_CASE("actor_learner: a resumed job goes on from its checkpoint's update and counters") {
  test::temp_dir tmp;
  auto c = test::quiet_example_job("cartpole_impala.json", tmp / "run");
  c.training = {};
  c.training.max_steps = 40;
  c.checkpoint.every_steps = 20;
  auto first = run_job(c, {});
  CHECK(first["updates"] == 40);
  const auto steps = first["env_steps"].get<int64_t>();
  c.training.max_steps = 60;
  job_options o;
  o.resume = true;
  auto second = run_job(c, o);
  CHECK(second["updates"] == 60);
  CHECK(second["env_steps"].get<int64_t>() > steps);
  CHECK(second["episodes"].get<int64_t>() >= first["episodes"].get<int64_t>());
  auto snap = checkpoint::load(second["checkpoint"].get<std::string>());
  CHECK(snap.meta.step == 60);
}

TEST_CASE("actor_learner: its config rules name the field") {
  auto base = nlohmann::json::parse(R"({"strategy": {"kind": "actor_learner"},
      "model": {"kind": "policy_value_mlp"}, "training": {"max_env_steps": 1000}})");
  auto bad = [&](const std::string& patch) {
    auto j = base;
    j.merge_patch(nlohmann::json::parse(patch));
    try {
      parse_job_config(j);
    } catch (const config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(bad("{}") == "no error");
  CHECK(
      bad(R"({"model": {"kind": "mlp"}})") ==
      R"(model.kind: the actor_learner strategy trains a policy/value network: expected one of "policy_value_layers", "policy_value_mlp", got "mlp")");
  // The policy head must fit the environment's action space.
  CHECK(bad(R"({"rl": {"env": "Pendulum-v1"}})") == "no error");
  CHECK(bad(R"({"rl": {"env": "MountainCar-v0", "policy_head": "softmax"}})") == "no error");
  CHECK(bad(R"({"rl": {"env": "Pendulum-v1", "policy_head": "softmax"}})") ==
        R"(rl.policy_head: the "softmax" policy head does not fit Pendulum-v1, whose actions )"
        R"(are Box(1) in [-2, 2]: use "gaussian" (or "auto"))");
  CHECK(bad(R"({"rl": {"env": "CartPole-v1", "policy_head": "gaussian"}})") ==
        R"(rl.policy_head: the "gaussian" policy head does not fit CartPole-v1, whose actions )"
        R"(are Discrete(2): use "softmax" (or "auto"))");
  CHECK(bad(R"({"rl": {"policy_head": "beta"}})") ==
        R"(rl.policy_head: expected one of "auto", "softmax", "gaussian", got "beta")");
  CHECK(bad(R"({"rl": {"initial_log_std": 3}})") ==
        "rl.initial_log_std: expected a number in [-10, 2], got 3");
  CHECK(bad(R"({"rl": {"normalize_advantages": 1}})") ==
        "rl.normalize_advantages: expected true or false, got 1");
  CHECK(
      bad(R"({"rl": {"env": "Pendulum-v2"}})") ==
      R"(rl.env: expected one of "Acrobot-v1", "CartPole-v1", "MountainCar-v0", )"
      R"("MountainCarContinuous-v0", "Pendulum-v1" or a {"kind": "gymnasium"} or {"kind": "plugin"} object, got "Pendulum-v2")");
  CHECK(
      bad(R"({"rl": {"env": "Pong"}})") ==
      R"(rl.env: expected one of "Acrobot-v1", "CartPole-v1", "MountainCar-v0", )"
      R"("MountainCarContinuous-v0", "Pendulum-v1" or a {"kind": "gymnasium"} or {"kind": "plugin"} object, got "Pong")");
  CHECK(bad(R"({"rl": {"learners": 2, "batch_unrolls": 3}})") ==
        "rl.batch_unrolls: expected a multiple of rl.learners (2), got 3");
  CHECK(bad(R"({"rl": {"batch_unrolls": 8, "queue_capacity": 4}})") ==
        "rl.queue_capacity: expected at least the unrolls one learner takes per update "
        "(rl.batch_unrolls / rl.learners = 8), got 4");
  CHECK(bad(R"({"training": {"max_env_steps": 0}})") ==
        "training: the actor_learner strategy needs a stop: training.max_steps (updates), "
        "training.max_env_steps or training.target_return");
  CHECK(bad(R"({"rl": {"discount": 0}})") == "rl.discount: expected a number in (0, 1], got 0");
  CHECK(bad(R"({"rl": {"actors": 0}})") == "rl.actors: expected an integer >= 1, got 0");
  CHECK(bad(R"({"rl": {"unroll_lenght": 5}})") ==
        R"(rl.unroll_lenght: unknown key; did you mean "unroll_length"?)");
  CHECK(bad(R"({"training": {"target_return": "high"}})") ==
        R"(training.target_return: expected a finite number, got "high")");
  CHECK(bad(R"({"rl": {"reward_scale": -1}})") == "rl.reward_scale: expected a number > 0, got -1");
  // The other strategies refuse the section and the policy model.
  CHECK(
      bad(R"({"strategy": {"kind": "mirrored"}, "rl": {}})") ==
      R"(model.kind: the mirrored strategy trains a classifier: expected one of "layers", "mlp", got "policy_value_mlp")");
  CHECK(bad(R"({"strategy": {"kind": "mirrored"}, "model": {"kind": "mlp"}, "rl": {}})") ==
        R"(rl: only the actor_learner strategy reads this section (strategy.kind is "mirrored"))");
}
