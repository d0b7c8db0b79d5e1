// Central inference (rl.inference "central"): the server's actions and
// logits against an rl_actor's own, a CartPole job solved through the
// server, the config rules, and a dead requester that does not hold the
// server's batches back.
#include <doctest/doctest.h>

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <cstring>

#include "actors/fault_injection.hpp"
#include "actors/inference_server.hpp"
#include "actors/rl_actor.hpp"
#include "actors/system_config.hpp"
#include "envs/policy_head.hpp"
#include "fixtures.hpp"
#include "kernels/cpu_kernels.hpp"
#include "models/dqn.hpp"
#include "models/random.hpp"
#include "policy_fixtures.hpp"
#include "runtime/job.hpp"

using namespace troupe;
using troupe::test::quiet_example_job;
using troupe::test::random_floats;
using troupe::test::tiny_model;

namespace {

constexpr uint64_t job_seed = 11;

// Actor `index`'s unroll under local inference, then the same observations
// through the server's batch function one step at a time, each step's batch
// with another actor's request before it: the actions and logits must be
// the actor's own.
void check_central_matches_local(const std::string& env, int64_t M, int64_t T) {
  kernels::init_cpu_kernels();
  const int64_t index = 3;
  rl_actor_compute c;
  init_rl_actor_compute(c, env, M, tiny_model(), derive_seed(job_seed, 5000 + index), job_seed);
  episode_report eps;
  const auto u = act_unroll(c, index, 0, T, eps);
  const int64_t O = c.env->spec().observation_size;
  inference_compute ic;
  ic.net = create_policy_value_model(tiny_model(), O, c.head, job_seed);
  const int64_t A = u.actions.numel() / T, P = c.head.outputs();
  for (int64_t t = 0; t < T; ++t) {
    inference_request other{7, t, tensor::uninitialized({5, O})};
    auto noise = random_floats(static_cast<std::size_t>(5 * O), 100 + t, 1.0);
    std::copy(noise.begin(), noise.end(), other.observations.f32());
    inference_request mine{index, t, tensor::uninitialized({M, O})};
    const float* x = u.observations.f32() + t * M * O;
    std::copy(x, x + M * O, mine.observations.f32());
    auto replies = infer_batch(ic, c.head, job_seed, {other, mine}, 4);
    REQUIRE(replies.size() == 2);
    const auto& r = replies[1];
    CHECK(r.policy_version == 4);
    REQUIRE(r.outputs.numel() == M * P);
    // Bit-identical: the MLP's forward computes each row alone, whatever
    // rows share its batch.
    CHECK(std::memcmp(r.outputs.f32(), u.behaviour_logits.f32() + t * M * P,
                      static_cast<std::size_t>(M * P) * sizeof(float)) == 0);
    REQUIRE(r.actions.numel() == A);
    REQUIRE(r.actions.type() == u.actions.type());
    const bool box = c.head.distribution == action_distribution::gaussian;
    const void* local = box ? static_cast<const void*>(u.actions.f32() + t * A)
                            : static_cast<const void*>(u.actions.data<int32_t>() + t * A);
    const void* central = box ? static_cast<const void*>(r.actions.f32())
                              : static_cast<const void*>(r.actions.data<int32_t>());
    CHECK(std::memcmp(central, local, static_cast<std::size_t>(A) * 4) == 0);
  }
}

// Ape-X: an epsilon-greedy actor's unroll and initial priorities under
// local inference, then the same steps through the server's batch function
// with the actor's epsilon, and its bootstrap Q-values as an outputs-only
// request: the actions and the priorities must be the actor's own.
void check_central_apex_matches_local(int64_t M, int64_t T) {
  kernels::init_cpu_kernels();
  const int64_t index = 2, n = 3;
  const double epsilon = 0.3, discount = 0.99;
  rl_actor_compute c;
  init_rl_actor_compute(c, "CartPole-v1", M, tiny_model(), derive_seed(job_seed, 5000 + index),
                        job_seed);
  c.epsilon = epsilon;
  episode_report eps;
  const auto u = act_unroll(c, index, 0, T, eps);
  const auto local = prioritized_transitions(c, u, n, discount);
  const int64_t O = c.env->spec().observation_size, A = c.head.outputs();
  inference_compute ic;
  ic.net = create_policy_value_model(tiny_model(), O, c.head, job_seed);
  bool greedy_differs = false;  // epsilon matters: some action is not the argmax
  for (int64_t t = 0; t < T; ++t) {
    inference_request mine{index, t, tensor::uninitialized({M, O})};
    mine.epsilon = epsilon;
    const float* x = u.observations.f32() + t * M * O;
    std::copy(x, x + M * O, mine.observations.f32());
    auto r = infer_batch(ic, c.head, job_seed, {mine}, 1).at(0);
    REQUIRE(r.actions.numel() == M);
    CHECK(std::memcmp(r.actions.data<int32_t>(), u.actions.data<int32_t>() + t * M,
                      static_cast<std::size_t>(M) * 4) == 0);
    for (int64_t m = 0; m < M; ++m) {
      const float* q = r.outputs.f32() + m * A;
      greedy_differs = greedy_differs || r.actions.data<int32_t>()[m] !=
                                             static_cast<int32_t>(std::max_element(q, q + A) - q);
    }
  }
  CHECK(greedy_differs);
  auto central = nstep_transitions(u, n, discount);
  inference_request bootstrap{index, -1, central.next_observations};
  bootstrap.outputs_only = true;
  const auto q_next = infer_batch(ic, c.head, job_seed, {bootstrap}, 1).at(0);
  CHECK(q_next.actions.numel() == 0);
  REQUIRE(q_next.outputs.numel() == central.size() * A);
  set_initial_priorities(central, u, q_next.outputs.f32(), A);
  REQUIRE(central.size() == local.size());
  CHECK(central.priorities == local.priorities);
}

}  // namespace

TEST_CASE("central inference: the server's actions and logits are a local actor's") {
  SUBCASE("CartPole, softmax") {
    check_central_matches_local("CartPole-v1", 6, 30);
  }
  SUBCASE("Pendulum, Gaussian") {
    check_central_matches_local("Pendulum-v1", 4, 10);
  }
}

TEST_CASE("central inference: Ape-X's epsilon-greedy actions and priorities are a local actor's") {
  check_central_apex_matches_local(8, 20);
}

TEST_CASE("central inference: Ape-X DQN solves CartPole through the inference server") {
  test::temp_dir tmp;
  auto c = load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_apex_central.json");
  c.logging.output_dir = tmp / "run";
  c.logging.level = "warn";
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["inference_batches"].get<int64_t>() > 0);
}

TEST_CASE("central inference: CartPole is solved through the inference server") {
  test::temp_dir tmp;
  auto c = quiet_example_job("cartpole_central.json", tmp / "run");
  c.logging.every_steps = 10;  // the server's counters come with each train line
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["env_steps"].get<int64_t>() <=
        c.training.max_env_steps + c.rl.actors * c.rl.envs_per_actor * c.rl.unroll_length);
  // A batch holds one actor's request (its 16 envs) at least, both at most.
  CHECK(s["inference_batches"].get<int64_t>() > 0);
  CHECK(s["inference_overdue_batches"].get<int64_t>() <= s["inference_batches"].get<int64_t>());
  // The actors share the server's process: every batch is its batcher's.
  CHECK(s["inference_in_process_batches"] == s["inference_batches"]);
  const double rows = s["inference_rows_per_batch"];
  CHECK(rows >= static_cast<double>(c.rl.envs_per_actor));
  CHECK(rows <= static_cast<double>(c.rl.actors * c.rl.envs_per_actor));
}

TEST_CASE("central inference: the server's forward on sim:0 solves CartPole") {
  test::temp_dir tmp;
  auto c = quiet_example_job("cartpole_central.json", tmp / "run");
  c.rl.central.device = "sim:0";
  auto s = run_job(c, {});
  CHECK(s["solved"] == true);
  CHECK(s["mean_return_100"].get<double>() >= 475);
  CHECK(s["inference_batches"].get<int64_t>() > 0);
}

TEST_CASE("central inference: a lost rl_actor is dropped and the job still solves") {
  test::temp_dir tmp;
  auto c = quiet_example_job("cartpole_central.json", tmp / "run");
  c.rl.actors = 3;
  job_options o;
  o.faults = inject_faults(fault_injection{}.fail_replica_at(1, 20));  // after 20 unrolls
  auto s = run_job(c, o);
  CHECK(s["solved"] == true);
  CHECK(s["actors_live"] == 2);
}

TEST_CASE("central inference: its config rules name the keys") {
  auto base = nlohmann::json::parse(R"({"strategy": {"kind": "actor_learner"},
      "model": {"kind": "policy_value_mlp"}, "training": {"max_env_steps": 1000},
      "rl": {"inference": "central"}})");
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
  CHECK(bad(R"({"rl": {"env": "Pendulum-v1"}})") == "no error");
  CHECK(bad(R"({"rl": {"inference": "remote"}})") ==
        R"(rl.inference: expected one of "local", "central", got "remote")");
  CHECK(bad(R"({"rl": {"algorithm": "apex_dqn"}})") == "no error");  // Ape-X, SEED style
  CHECK(bad(R"({"rl": {"central": {"max_batch": 0}}})") ==
        "rl.central.max_batch: expected an integer >= 1, got 0");
  CHECK(bad(R"({"rl": {"central": {"max_wait_us": -1}}})") ==
        "rl.central.max_wait_us: expected an integer >= 0, got -1");
  CHECK(bad(R"({"rl": {"central": {"yield_us": 100001}}})") ==
        "rl.central.yield_us: expected an integer in [0, 100000], got 100001");
  CHECK(bad(R"({"rl": {"central": {"device": "sim:0"}}})") == "no error");
  CHECK(bad(R"({"rl": {"central": {"device": "gpu:0"}}})") ==
        R"(rl.central.device: expected "" (the host), "cpu:N", "sim:N" or "cuda:N", got "gpu:0")");
  CHECK(bad(R"({"rl": {"inference": "local", "central": {"device": "sim:0"}}})") ==
        R"(rl.central.device: applies with rl.inference "central" only, got "local")");
  CHECK(
      bad(R"({"rl": {"central": {"device": "sim:0"}},
                "model": {"kind": "policy_value_layers", "layers": [{"type": "dense", "units": 8}]}})") ==
      R"(rl.central.device: an inference server on sim:0 runs model.kind "policy_value_mlp", got "policy_value_layers")");
  CHECK(bad(R"({"rl": {"central": {"max_wiat_us": 5}}})") ==
        R"(rl.central.max_wiat_us: unknown key; did you mean "max_wait_us"?)");
  // rl_actors on worker tasks reach the server across processes (test_nodes).
  CHECK(bad(R"({"cluster": {"tasks": {"chief": ["127.0.0.1:7000"],
                                      "worker": ["127.0.0.1:7001"]}}})") == "no error");
}

TEST_CASE("central inference: a dead requester does not hold the next batches back") {
  kernels::init_cpu_kernels();
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  const auto head = envs::policy_head_for(envs::make_env("CartPole-v1", 1)->spec(), "auto");
  inference_server_config ic;
  ic.device = std::make_shared<cpu_device>("cpu:0");
  ic.model = tiny_model();
  ic.observation_size = 4;
  ic.head = head;
  ic.actors = 2;
  ic.max_wait_us = 600'000'000;  // only "every live actor asked" runs a batch here
  auto server = spawn_inference_server(sys, ic);
  auto net = create_policy_value_model(tiny_model(), 4, head, 1);
  policy_weights w{1, {}};
  for (auto& v : net->variables()) w.values.push_back(v.value);
  self->send(server, weights_atom::value, w);
  // Actor 0's first step shares a batch with actor 1's; then actor 0 dies,
  // and actor 1's second step runs alone once the server saw it go.
  // (Spawned with an argument: CAF 0.17 dereferences a null argument tuple
  // for a functor without arguments, which UBSan reports.)
  sys.spawn(
      [server](caf::event_based_actor* a, int) {
        a->request(server, std::chrono::seconds(20), infer_atom::value,
                   inference_request{0, 0, tensor({3, 4})})
            .then([a](inference_reply&) { a->quit(); });
      },
      0);
  for (int64_t step = 0; step < 2; ++step) {
    bool answered = false;
    self->request(server, std::chrono::seconds(20), infer_atom::value,
                  inference_request{1, step, tensor({2, 4})})
        .receive(
            [&](inference_reply& r) {
              answered = true;
              CHECK(r.policy_version == 1);
              CHECK(r.actions.shape() == shape_t{2});
              CHECK(r.outputs.shape() == shape_t{2, 2});
            },
            [](caf::error& e) { FAIL(describe(e)); });
    CHECK(answered);
  }
  self->send_exit(server, caf::exit_reason::user_shutdown);
}

TEST_CASE("central inference: message batches do not wait for the actors that ask the batcher") {
  kernels::init_cpu_kernels();
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  inference_server_config ic;
  ic.device = std::make_shared<cpu_device>("cpu:0");
  ic.model = tiny_model();
  ic.observation_size = 4;
  ic.head = envs::policy_head_for(envs::make_env("CartPole-v1", 1)->spec(), "auto");
  ic.actors = 2;
  ic.max_wait_us = 600'000'000;  // only "every actor that asks by message" runs a batch here
  auto server = spawn_inference_server(sys, ic);
  auto net = create_policy_value_model(tiny_model(), 4, ic.head, 1);
  policy_weights w{1, {}};
  for (auto& v : net->variables()) w.values.push_back(v.value);
  self->send(server, weights_atom::value, w);
  // Actor 0 runs in the server's process and asks its batcher; actor 1
  // (another process's) asks by message and is the only one to wait for.
  auto batcher = find_local_batcher(caf::actor_cast<caf::actor_addr>(server));
  REQUIRE(batcher != nullptr);
  batcher->join_in_process();
  bool answered = false;
  self->request(server, std::chrono::seconds(20), infer_atom::value,
                inference_request{1, 0, tensor({2, 4})})
      .receive(
          [&](inference_reply& r) {
            answered = true;
            CHECK(r.actions.shape() == shape_t{2});
          },
          [](caf::error& e) { FAIL(describe(e)); });
  CHECK(answered);
  self->send_exit(server, caf::exit_reason::user_shutdown);
}
