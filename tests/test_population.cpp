// Population-based training (rl.population, strategies/population.cpp):
// the config rules, the members' starting draws, truncation selection, the
// explore step's factors and ranges, an exploit copying a member's weights
// and optimizer state bit for bit, and a whole CartPole population whose
// best member's checkpoint is written and resumed.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <chrono>
#include <cmath>
#include <set>

#include "actors/learner.hpp"
#include "actors/system_config.hpp"
#include "checkpoint/checkpoint.hpp"
#include "fixtures.hpp"
#include "kernels/cpu_kernels.hpp"
#include "models/random.hpp"
#include "policy_fixtures.hpp"
#include "runtime/job.hpp"
#include "strategies/population.hpp"

using namespace troupe;
using troupe::test::metrics_lines;
using troupe::test::tiny_model;

namespace {

constexpr auto timeout = std::chrono::seconds(30);

std::string config_error_of(const std::string& patch) {
  auto j = nlohmann::json::parse(R"({"strategy": {"kind": "actor_learner"},
      "model": {"kind": "policy_value_mlp"}, "training": {"max_env_steps": 1000},
      "rl": {"actors": 4, "population": {"size": 4}}})");
  j.merge_patch(nlohmann::json::parse(patch));
  try {
    parse_job_config(j);
  } catch (const config_error& e) {
    return e.what();
  }
  return "no error";
}

population_config population_of(const std::string& json) {
  auto c = parse_job_config(nlohmann::json::parse(
      R"({"strategy": {"kind": "actor_learner"}, "model": {"kind": "policy_value_mlp"},
          "training": {"max_env_steps": 1000}, "rl": {"actors": 8, "population": )" +
      json + "}}"));
  return c.rl.population;
}

}  // namespace

TEST_CASE("population: bad config is refused naming the key") {
  CHECK(config_error_of("{}") == "no error");
  CHECK(config_error_of(R"({"rl": {"population": {"size": 1}}})") ==
        "rl.population.size: expected an integer >= 2, got 1");
  CHECK(config_error_of(R"({"rl": {"population": {"size": "4"}}})") ==
        R"(rl.population.size: expected an integer >= 2, got "4")");
  CHECK(config_error_of(R"({"rl": {"population": {"size": 2.5}}})") ==
        "rl.population.size: expected an integer >= 2, got 2.5");
  CHECK(config_error_of(R"({"rl": {"population": {"learning_rate": [0.1, 0.01]}}})") ==
        "rl.population.learning_rate: expected one value per member (rl.population.size 4), "
        "got 2");
  CHECK(config_error_of(R"({"rl": {"population": {"learning_rate": {"min": 0.1}}}})") ==
        "rl.population.learning_rate.max: missing: expected the range's max (a positive number)");
  CHECK(
      config_error_of(R"({"rl": {"population": {"learning_rate": {"min": 0.1, "max": 0.01}}}})") ==
      "rl.population.learning_rate.max: expected at least min (0.1), got 0.01");
  CHECK(
      config_error_of(R"({"rl": {"population": {"entropy_cost": {"sampling": "normal"}}}})") ==
      R"(rl.population.entropy_cost.sampling: expected one of "uniform", "log_uniform", got "normal")");
  CHECK(config_error_of(R"({"rl": {"population": {"explore": {"factors": [0.8, 0]}}}})") ==
        "rl.population.explore.factors[1]: expected a number > 0, got 0");
  CHECK(config_error_of(R"({"rl": {"population": {"exploit": {"quantile": 0.75}}}})") ==
        "rl.population.exploit.quantile: expected a number in (0, 0.5], got 0.75");
  CHECK(config_error_of(R"({"rl": {"population": {"interval": 5}}})")
            .rfind("rl.population.interval: unknown key", 0) == 0);
  // The strategy's rules: IMPALA learners (several a member, data-parallel),
  // an actor each.
  CHECK(config_error_of(R"({"rl": {"learners": 2, "batch_unrolls": 4}})") == "no error");
  CHECK(config_error_of(R"({"rl": {"actors": 3}})") ==
        "rl.actors: expected at least one per member of rl.population (size 4), got 3");
  CHECK(
      config_error_of(R"({"rl": {"inference": "central"}})") ==
      R"(rl.population: population-based training supports rl.inference "local" only, got "central")");
  CHECK(
      config_error_of(R"({"rl": {"algorithm": "apex_dqn"}})") ==
      R"(rl.population: population-based training supports rl.algorithm "impala" only, got "apex_dqn")");
}

TEST_CASE("population: the effective config reads back as itself") {
  auto c = parse_job_config(nlohmann::json::parse(
      R"({"strategy": {"kind": "actor_learner"}, "model": {"kind": "policy_value_mlp"},
          "training": {"max_env_steps": 1000}, "rl": {"actors": 4, "population": {"size": 4,
          "learning_rate": [1e-5, 1e-3, 1e-2, 1e-1], "entropy_cost": {"min": 1e-4, "max": 1e-2},
          "explore": {"resample_probability": 0.25}}}})"));
  const auto j = to_json(c);
  CHECK(j["rl"]["population"]["entropy_cost"]["sampling"] == "log_uniform");
  CHECK(j["rl"]["population"]["explore"]["factors"] == nlohmann::json{0.8, 1.2});
  CHECK(to_json(parse_job_config(j)) == j);
  // No population: the key is absent from the effective config.
  c.rl.population = {};
  CHECK(!to_json(c)["rl"].contains("population"));
}

TEST_CASE("population: members start at their values or at draws from the job seed") {
  auto p = population_of(
      R"({"size": 4, "learning_rate": [1e-5, 1e-3, 1e-2, 1e-1],
          "entropy_cost": {"sampling": "log_uniform", "min": 1e-4, "max": 1e-2}})");
  const auto a = initial_hyperparameters(p, 0.003, 0.01, 7);
  const auto b = initial_hyperparameters(p, 0.003, 0.01, 7);
  const auto other = initial_hyperparameters(p, 0.003, 0.01, 8);
  REQUIRE(a.size() == 4);
  const double lrs[] = {1e-5, 1e-3, 1e-2, 1e-1};
  std::set<double> costs;
  for (std::size_t m = 0; m < 4; ++m) {
    CHECK(a[m].learning_rate == lrs[m]);
    CHECK(a[m].entropy_cost >= 1e-4);
    CHECK(a[m].entropy_cost <= 1e-2);
    CHECK(a[m].entropy_cost == b[m].entropy_cost);  // the same seed, the same draws
    costs.insert(a[m].entropy_cost);
  }
  CHECK(costs.size() == 4);
  CHECK(other[0].entropy_cost != a[0].entropy_cost);
  // Unset: the job's own values.
  const auto job = initial_hyperparameters(population_of(R"({"size": 2})"), 0.003, 0.01, 7);
  CHECK(job[1].learning_rate == 0.003);
  CHECK(job[1].entropy_cost == 0.01);
}

TEST_CASE("population: truncation selection pairs the bottom quantile with the top") {
  splitmix64 rng(3);
  std::vector<member_score> four = {{0, -200, 5}, {1, -90, 5}, {2, -500, 5}, {3, -120, 5}};
  auto pairs = truncation_pairs(four, 0.25, rng);
  REQUIRE(pairs.size() == 1);
  CHECK(pairs[0] == std::pair<int64_t, int64_t>{2, 1});
  // Eight members, quantile 0.25: the two worst take one of the two best.
  std::vector<member_score> eight;
  for (int64_t m = 0; m < 8; ++m) eight.push_back({m, static_cast<double>(m), 3});
  for (int round = 0; round < 20; ++round) {
    auto p = truncation_pairs(eight, 0.25, rng);
    REQUIRE(p.size() == 2);
    CHECK(p[0].first == 1);
    CHECK(p[1].first == 0);
    for (const auto& [member, source] : p) CHECK((source == 7 || source == 6));
  }
  // Members without episodes are not ranked; fewer than two ranked, no pairs.
  std::vector<member_score> one = {{0, 10, 4}, {1, -10, 0}};
  CHECK(truncation_pairs(one, 0.5, rng).empty());
}

TEST_CASE("population: explore multiplies by a factor within the range, or resamples") {
  auto p = population_of(
      R"({"size": 2, "learning_rate": {"min": 1e-5, "max": 1e-1},
          "entropy_cost": [0.001, 0.01]})");
  splitmix64 rng(11);
  const member_hyperparameters from{1e-3, 0.005};
  std::set<double> lrs;
  for (int i = 0; i < 200; ++i) {
    population_event e;
    auto out = explore(p, from, rng, e);
    CHECK(e.learning_rate_by == "perturbed");
    const double f = out.learning_rate / from.learning_rate;
    CHECK((std::abs(f - 0.8) < 1e-12 || std::abs(f - 1.2) < 1e-12));
    lrs.insert(out.learning_rate);
    const double g = out.entropy_cost / from.entropy_cost;
    CHECK((std::abs(g - 0.8) < 1e-12 || std::abs(g - 1.2) < 1e-12));
  }
  CHECK(lrs.size() == 2);  // both factors are drawn
  // At a bound, a perturbed value stays inside the range.
  population_event e;
  for (int i = 0; i < 50; ++i) CHECK(explore(p, {1e-1, 0.01}, rng, e).learning_rate <= 1e-1);
  // Resampling always: log-uniform draws over the range; "values" draw a value.
  p.resample_probability = 1;
  for (int i = 0; i < 200; ++i) {
    auto out = explore(p, from, rng, e);
    CHECK(e.learning_rate_by == "resampled");
    CHECK(out.learning_rate >= 1e-5);
    CHECK(out.learning_rate <= 1e-1);
    CHECK((out.entropy_cost == 0.001 || out.entropy_cost == 0.01));
  }
}

namespace {

learner_actor tiny_learner(caf::actor_system& sys, uint64_t seed, int64_t member) {
  learner_config lc;
  lc.member = member;
  lc.device = std::make_shared<cpu_device>("cpu:" + std::to_string(member));
  lc.model = tiny_model();
  lc.observation_size = 4;
  lc.actions = 2;
  lc.optimizer.kind = "adam";
  lc.seed = seed;
  return spawn_learner(sys, lc);
}

model_state state_of(caf::scoped_actor& self, const learner_actor& l) {
  model_state out;
  self->request(l, timeout, state_atom::value)
      .receive([&](model_state& ms) { out = std::move(ms); },
               [](caf::error& e) { FAIL(describe(e)); });
  return out;
}

}  // namespace

TEST_CASE("population: an exploit copies weights and optimizer state bit for bit") {
  kernels::init_cpu_kernels();
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto top = tiny_learner(sys, 1, 0);
  auto bottom = tiny_learner(sys, 2, 1);
  // The top member's state made unlike a fresh one: random variables and
  // Adam slots, 7 updates.
  auto ms = state_of(self, top);
  test::scramble_state(ms, 5);
  self->request(top, timeout, restore_atom::value, ms)
      .receive([](int64_t v) { CHECK(v == 7); }, [](caf::error& e) { FAIL(describe(e)); });
  population_controller_config pc;
  pc.population.size = 2;
  pc.seed = 1;
  pc.members = {{top}, {bottom}};
  pc.hyperparameters = {{1e-3, 0.01}, {1e-5, 0.02}};
  auto controller = spawn_population_controller(sys, pc);
  std::vector<member_score> scores = {{0, -80, 10}, {1, -400, 10}};
  self->request(controller, timeout, round_atom::value, scores)
      .receive(
          [&](population_round& r) {
            REQUIRE(r.events.size() == 1);
            const auto& e = r.events[0];
            CHECK(e.member == 1);
            CHECK(e.source == 0);
            CHECK(e.before.learning_rate == 1e-3);
            const double f = e.after.learning_rate / 1e-3;
            CHECK((std::abs(f - 0.8) < 1e-12 || std::abs(f - 1.2) < 1e-12));
            CHECK(r.members[1].learning_rate == e.after.learning_rate);
            CHECK(r.members[0].learning_rate == 1e-3);
          },
          [](caf::error& e) { FAIL(describe(e)); });
  const auto a = state_of(self, top), b = state_of(self, bottom);
  REQUIRE(a.variables.size() == b.variables.size());
  REQUIRE(a.slots.size() == b.slots.size());
  REQUIRE(!a.slots.empty());
  for (std::size_t i = 0; i < a.variables.size(); ++i)
    CHECK(a.variables[i].value == b.variables[i].value);
  for (std::size_t i = 0; i < a.slots.size(); ++i) {
    CHECK(a.slots[i].name == b.slots[i].name);
    CHECK(a.slots[i].value == b.slots[i].value);
  }
  for (auto& h : {caf::actor_cast<caf::actor>(top), caf::actor_cast<caf::actor>(bottom),
                  caf::actor_cast<caf::actor>(controller)})
    self->send_exit(h, caf::exit_reason::user_shutdown);
}

namespace {

// The CartPole example for 30,000 env steps with 4 actors of 8 envs, its
// output under `out`.
job_config short_cartpole(const std::string& out) {
  auto c = test::quiet_example_job("cartpole_impala.json", out);
  c.training = {};
  c.training.max_env_steps = 30000;
  c.rl.actors = 4;
  c.rl.envs_per_actor = 8;
  return c;
}

}  // namespace

TEST_CASE("population: a CartPole population exploits, saves its best member and resumes") {
  test::temp_dir tmp;
  auto c = short_cartpole(tmp / "run");
  c.rl.population = population_of(
      R"({"size": 4, "interval_env_steps": 3000, "learning_rate": [1e-5, 1e-4, 1e-3, 1e-2]})");
  auto s = run_job(c, {});
  CHECK(s["stop_reason"] == "max_env_steps");
  CHECK(s["learners"] == 4);
  REQUIRE(s.contains("population"));
  const auto& pop = s["population"];
  CHECK(pop["members"].size() == 4);
  CHECK(pop["rounds"].get<int64_t>() >= 1);
  auto events = metrics_lines(tmp / "run", "population");
  CHECK(static_cast<int64_t>(events.size()) == pop["exploits"].get<int64_t>());
  REQUIRE(!events.empty());
  for (const auto& e : events) {
    CHECK(e["member"] != e["source"]);
    CHECK(e["member_return"].get<double>() <= e["source_return"].get<double>());
    const double f = e["learning_rate"].get<double>() / e["learning_rate_before"].get<double>();
    const double clamped = e["learning_rate"].get<double>();
    CHECK((std::abs(f - 0.8) < 1e-9 || std::abs(f - 1.2) < 1e-9 || clamped == 1e-5 ||
           clamped == 1e-2));
  }
  auto train = metrics_lines(tmp / "run", "train");
  REQUIRE(!train.empty());
  CHECK(train.back()["population"]["members"].size() == 4);
  CHECK(train.back()["best_learning_rate"].get<double>() > 0);
  // The job's checkpoint is its best member's, with every member's
  // hyperparameters.
  auto snap = checkpoint::load(s["checkpoint"].get<std::string>());
  CHECK(snap.variables.size() == 8);
  CHECK(!snap.slots.empty());
  const auto saved = snap.meta.extra["population"];
  CHECK(saved["best_member"] == pop["best_member"]);
  REQUIRE(saved["members"].size() == 4);
  // Resumed with no rounds due: every member keeps its saved hyperparameters.
  c.training.max_env_steps = 40000;
  c.rl.population.interval_env_steps = 1000000;
  job_options o;
  o.resume = true;
  auto second = run_job(c, o);
  CHECK(second["env_steps"].get<int64_t>() > s["env_steps"].get<int64_t>());
  // The checkpoint's step is its member's own update count.
  CHECK(second["updates"].get<int64_t>() > snap.meta.step);
  for (std::size_t m = 0; m < 4; ++m)
    CHECK(second["population"]["members"][m]["learning_rate"] ==
          saved["members"][m]["learning_rate"]);
}

// Data-parallel learners in each member: every exploit lands on both of a
// member's learners (the round waits for both), and the job trains on.
TEST_CASE("population: members of two data-parallel learners each exploit and train on") {
  test::temp_dir tmp;
  auto c = short_cartpole(tmp / "run");
  c.rl.learners = 2;
  c.rl.batch_unrolls = 2;
  c.rl.population =
      population_of(R"({"size": 2, "interval_env_steps": 3000, "learning_rate": [1e-5, 1e-2]})");
  auto s = run_job(c, {});
  CHECK(s["stop_reason"] == "max_env_steps");
  CHECK(s["learners"] == 4);
  const auto& pop = s["population"];
  CHECK(pop["members"].size() == 2);
  CHECK(pop["rounds"].get<int64_t>() >= 1);
  auto events = metrics_lines(tmp / "run", "population");
  REQUIRE(!events.empty());
  CHECK(static_cast<int64_t>(events.size()) == pop["exploits"].get<int64_t>());
  for (const auto& e : events) CHECK(e["member"] != e["source"]);
  CHECK(s["updates"].get<int64_t>() > 0);
}
