// The strategy layer: a strategy is one class registered by name. This test
// defines a strategy of its own ("local SGD": every replica trains its own
// copy on its slice of the data, and every k steps the replicas average
// their variables through the reducers) and runs it through the same path as
// `troupe run`, touching no other file: its config keys too (which it
// accepts, its own key's default and rules, the errors naming the path).
#include <doctest/doctest.h>

#include "runtime/job.hpp"
#include "runtime/topology.hpp"
#include "strategies/lockstep_driver.hpp"
#include "strategies/replica_group.hpp"
#include "strategies/strategy.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;

namespace {

// Local SGD against the collective layer: each replica steps on its own,
// and every `every` steps the replicas' variables are averaged in place
// through the replica's process_group, in the same device task. The step
// never knows which backend runs the all-reduce (the reducer actors or the
// device group, as strategy.reducer says).
class local_sgd_step final : public replica_step {
 public:
  local_sgd_step(replica_wiring w, int64_t every) : wiring_(std::move(w)), every_(every) {}

  void init(compute_state& cs) override { cs.collectives = make_replica_group(wiring_, cs); }

  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    h.set_busy(false);
    run_on_device(
        h, "local_sgd", step, std::move(b),
        [every = every_, fail = h.fail_at_step()](compute_state& cs, const batch& b, int64_t step) {
          auto s = compute_gradients(cs, b, step, fail, /*local_mean=*/true);
          cs.apply_update();
          if ((step + 1) % every == 0) average_variables(cs);
          return s;
        },
        std::move(rp));
  }

 private:
  static void average_variables(compute_state& cs) {
    for (auto& v : cs.net->variables())
      cs.collectives->issue_all_reduce(v.value.f32(), static_cast<std::size_t>(v.value.numel()),
                                       reduce_op::mean);
    cs.collectives->complete();
  }

  replica_wiring wiring_;
  int64_t every_;
};

const strategy_option<int64_t> average_every{"average_every", 4, integer_in(1, 1000000)};

class local_sgd final : public strategy {
 public:
  std::string name() const override { return "local_sgd"; }
  std::vector<strategy_key> keys() const override {
    return {strategy_keys::replicas(),
            strategy_keys::reducer(
                {reducer_algorithm::ring, reducer_algorithm::tree, reducer_algorithm::device}),
            average_every.key()};
  }
  void validate(const job_config& c) const override {
    if (c.strategy.replicas < 2)
      throw config_error("strategy.replicas", "local_sgd averages over at least 2 replicas, got " +
                                                  std::to_string(c.strategy.replicas));
  }
  reducer_parts make_reducers(caf::actor_system& sys, const job_config& c,
                              const reducer_wiring& w) const override {
    return make_collective_parts(sys, c, w);
  }
  std::unique_ptr<replica_step> make_replica_step(const job_config& c,
                                                  const replica_wiring& w) const override {
    return std::make_unique<local_sgd_step>(w, average_every.of(c.strategy));
  }
  bool replicas_wait_on_device() const override { return true; }
  std::unique_ptr<job_driver> make_driver(const job_plan&) const override {
    return std::make_unique<lockstep_driver>();
  }
};

void register_local_sgd() {
  static const bool once = [] {
    register_strategy(std::make_shared<local_sgd>());
    return true;
  }();
  (void)once;
}

// A strategy whose own code throws on an actor's thread (not in device
// work, which the hosts already catch): on the replica (its step's
// continuation) or on the coordinator (at the end of an epoch).
enum class explode_on { replica, coordinator };

class exploding_step final : public replica_step {
 public:
  explicit exploding_step(bool explode) : explode_(explode) {}
  void run(replica_host& h, int64_t step, batch b, step_promise rp) override {
    h.set_busy(true);
    h.on_device<step_stats>(
        [b = std::move(b), step](compute_state& cs) {
          return compute_gradients(cs, b, step, -1, /*local_mean=*/true);
        },
        [&h, rp, step, explode = explode_](step_stats& s) mutable {
          if (explode && step == 3 && h.index() == 1)
            throw std::runtime_error("the custom step exploded at step 3");
          h.count(s);
          h.step_finished(rp, s);
        });
  }

 private:
  bool explode_;
};

template <explode_on where>
class exploding final : public strategy {
 public:
  std::string name() const override {
    return where == explode_on::replica ? "explode_on_replica" : "explode_on_coordinator";
  }
  reducer_parts make_reducers(caf::actor_system& sys, const job_config& c,
                              const reducer_wiring& w) const override {
    reducer_parts out;
    out.per_replica = spawn_reducer_group(sys, w.local_replicas, reducer_config_of(c));
    return out;
  }
  std::unique_ptr<replica_step> make_replica_step(const job_config&,
                                                  const replica_wiring&) const override {
    return std::make_unique<exploding_step>(where == explode_on::replica);
  }
  std::unique_ptr<job_driver> make_driver(const job_plan&) const override {
    return std::make_unique<lockstep_driver>();
  }
  void on_epoch_end(coordinator_host&, int64_t epoch) const override {
    if (where == explode_on::coordinator)
      throw std::runtime_error("the custom epoch hook exploded after epoch " +
                               std::to_string(epoch));
  }
};

void register_exploding() {
  static const bool once = [] {
    register_strategy(std::make_shared<exploding<explode_on::replica>>());
    register_strategy(std::make_shared<exploding<explode_on::coordinator>>());
    return true;
  }();
  (void)once;
}

}  // namespace

TEST_CASE("the built-in strategies are registered by name") {
  for (std::string name : {"one_device", "mirrored", "central_storage", "parameter_server",
                           "elastic_average", "actor_learner"}) {
    CAPTURE(name);
    auto s = find_strategy(name);
    REQUIRE(s);
    CHECK(s->name() == name);
  }
  CHECK(find_strategy("actor_learner")->own_job());
  CHECK_FALSE(find_strategy("mirrored")->own_job());
  CHECK_FALSE(find_strategy("horovod"));
  CHECK_THROWS_WITH_AS(register_strategy(find_strategy("mirrored")),
                       "strategy 'mirrored' is already registered", std::invalid_argument);
}

TEST_CASE("a strategy defined in a test runs through the normal job path") {
  register_local_sgd();
  test::strategy_env env(480);

  SUBCASE("its config rules apply at parse time, with the JSON path") {
    CHECK_THROWS_WITH_AS(
        parse_job_config(R"({"strategy": {"kind": "local_sgd", "replicas": 1}})"_json),
        "strategy.replicas: local_sgd averages over at least 2 replicas, got 1", config_error);
    auto c = parse_job_config(R"({"strategy": {"kind": "local_sgd", "replicas": 2},
                                  "devices": ["cpu:0", "cpu:1"]})"_json);
    CHECK(c.strategy.kind == "local_sgd");
  }

  SUBCASE("its own key: a default, its rules, and the effective config") {
    const std::string two = R"("replicas": 2}, "devices": ["cpu:0", "cpu:1"]})";
    auto parse = [&](const std::string& keys) {
      return parse_job_config(
          nlohmann::json::parse(R"({"strategy": {"kind": "local_sgd", )" + keys + two));
    };
    auto error_of = [&](const std::string& keys) {
      try {
        parse(keys);
      } catch (const config_error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    auto defaulted = parse("");
    CHECK(average_every.of(defaulted.strategy) == 4);
    CHECK(to_json(defaulted)["strategy"]["average_every"] == 4);
    CHECK(to_json(defaulted)["strategy"]["reducer"]["algorithm"] == "ring");
    auto given = parse(R"("average_every": 7,)");
    CHECK(average_every.of(given.strategy) == 7);
    // The effective config reads back the same (a checkpoint's manifest).
    CHECK(average_every.of(parse_job_config(to_json(given)).strategy) == 7);
    CHECK(error_of(R"("average_every": 0,)") ==
          "strategy.average_every: expected an integer >= 1, got 0");
    CHECK(error_of(R"("average_every": 2000000,)") ==
          "strategy.average_every: expected an integer in [1, 1000000], got 2000000");
    CHECK(error_of(R"("average_every": "often",)") ==
          R"(strategy.average_every: expected an integer >= 1, got "often")");
    CHECK(error_of(R"("average_evry": 2,)") ==
          R"(strategy.average_evry: unknown key; did you mean "average_every"?)");
    CHECK(
        error_of(R"("reducer": {"algorithm": "reduce_to_one"},)") ==
        R"(strategy.reducer.algorithm: expected one of "ring", "tree", "device", got "reduce_to_one")");
    // Keys of other strategies are refused, naming the strategy, both ways.
    CHECK(
        error_of(R"("communication_period": 2,)") ==
        R"(strategy.communication_period: the local_sgd strategy does not use this key (a key of "elastic_average"))");
    CHECK_THROWS_WITH_AS(
        parse_job_config(R"({"strategy": {"kind": "mirrored", "average_every": 2}})"_json),
        R"(strategy.average_every: the mirrored strategy does not use this key (a key of "local_sgd"))",
        config_error);
    // The other strategies' effective configs carry none of its keys.
    CHECK_FALSE(to_json(parse_job_config(R"({"strategy": {"kind": "mirrored"}})"_json))["strategy"]
                    .contains("average_every"));
  }

  SUBCASE("averaging every step is mirrored SGD, up to float rounding") {
    auto m = env.job("mirrored", "sgd", 2, 48);
    m.training.max_steps = 10;
    auto ref = test::variables_of(run_job(m));
    auto l = env.job("local_sgd", "sgd", 2, 48);
    l.training.max_steps = 10;
    average_every.set(l.strategy, 1);
    auto s = run_job(l);
    CHECK(s["strategy"] == "local_sgd");
    CHECK(s["steps"] == 10);
    CHECK(test::max_abs_diff(ref, test::variables_of(s)) < 1e-5);
    CHECK(test::metrics_of(s, "epoch").size() == 1);
  }

  SUBCASE("the same step over the device group gives the same model as over the actors") {
    auto ring = env.job("local_sgd", "sgd", 2, 48);
    ring.training.max_steps = 10;
    average_every.set(ring.strategy, 5);
    auto device = env.job("local_sgd", "sgd", 2, 48);
    device.training.max_steps = 10;
    average_every.set(device.strategy, 5);
    device.strategy.reducer.algorithm = reducer_algorithm::device;
    auto by_actors = test::variables_of(run_job(ring));
    auto by_device = test::variables_of(run_job(device));
    CHECK(test::max_abs_diff(by_actors, by_device) < 1e-6);
    auto m = env.job("mirrored", "sgd", 2, 48);
    m.training.max_steps = 10;
    CHECK(test::max_abs_diff(test::variables_of(run_job(m)), by_device) > 1e-6);
  }

  SUBCASE("averaging every 5 steps is not the same model, and it resumes") {
    auto l = env.job("local_sgd", "sgd", 2, 48);
    l.training.max_steps = 10;
    average_every.set(l.strategy, 5);
    l.checkpoint.every_steps = 5;
    auto s = run_job(l);
    auto m = env.job("mirrored", "sgd", 2, 48);
    m.training.max_steps = 10;
    CHECK(test::max_abs_diff(test::variables_of(run_job(m)), test::variables_of(s)) > 1e-6);
    job_options o;
    o.resume = true;
    o.output_dir = s["output_dir"].get<std::string>();
    l.training.max_steps = 15;
    auto r = run_job(l, o);
    CHECK(r["steps"] == 15);
    CHECK(r["steps_this_run"] == 5);
  }
}

TEST_CASE("fan_in: replies in request order, one continuation, the first error only") {
  SUBCASE("every reply in: done once, in request order") {
    std::vector<int> got;
    int done = 0, errors = 0;
    fan_in<int> f(
        3,
        [&](std::vector<int>& all) {
          ++done;
          got = all;
        },
        [&](caf::error&) { ++errors; });
    int a = 30, b = 10, c = 20;
    f.reply(2)(a);
    f.reply(0)(b);
    CHECK(done == 0);
    f.reply(1)(c);
    CHECK(done == 1);
    CHECK(got == std::vector<int>{10, 20, 30});
    CHECK(errors == 0);
  }
  SUBCASE("an error: reported once, later replies and errors dropped") {
    int done = 0, errors = 0;
    fan_in<int> f(
        2, [&](std::vector<int>&) { ++done; }, [&](caf::error&) { ++errors; });
    int v = 1;
    f.reply(0)(v);
    auto e = caf::make_error(caf::sec::request_timeout);
    f.error()(e);
    f.error()(e);
    f.reply(1)(v);
    CHECK(errors == 1);
    CHECK(done == 0);
  }
  SUBCASE("nothing to wait for: done at once") {
    int done = 0;
    fan_in<int> f(
        0, [&](std::vector<int>& all) { done += all.empty() ? 1 : 100; }, nullptr);
    CHECK(done == 1);
  }
}

TEST_CASE("an exception thrown on an actor's thread ends the job with its message") {
  // CAF's default exception handler keeps only sec::runtime_error: the job
  // failed with "system_error(runtime_error)", or (on the coordinator) never
  // answered at all.
  register_exploding();
  test::strategy_env env(480);
  SUBCASE("on a replica") {
    auto c = env.job("explode_on_replica", "sgd", 2, 48);
    c.training.max_steps = 10;
    CHECK_THROWS_WITH_AS(run_job(c),
                         doctest::Contains("replica 1 (cpu:1) stopped: replica 1: the custom step "
                                           "exploded at step 3"),
                         job_error);
  }
  SUBCASE("on the coordinator") {
    auto c = env.job("explode_on_coordinator", "sgd", 2, 48);
    c.training.epochs = 2;
    CHECK_THROWS_WITH_AS(
        run_job(c), doctest::Contains("coordinator: the custom epoch hook exploded after epoch 0"),
        job_error);
  }
}
