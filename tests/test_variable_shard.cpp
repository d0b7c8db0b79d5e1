// variable_shard: push/pull semantics against hand-computed updates (values
// chosen so every float result is exact), subset pulls, order of async
// applies, aggregate mode, versions, staleness, mismatches and checkpoints.
#include <doctest/doctest.h>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "actors/system_config.hpp"
#include "actors/variable_shard.hpp"

using namespace troupe;

namespace {

constexpr auto timeout = std::chrono::seconds(10);
using fvec = std::vector<float>;

struct fixture {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
};

optimizer_config sgd(double lr) {
  optimizer_config c;
  c.kind = "sgd";
  c.learning_rate = lr;
  return c;
}

// Pieces "a" [3] = {1, 2, 3} and "b" [2, 2] = all ones.
variable_shard_config two_pieces(optimizer_config opt, int64_t aggregate = 0) {
  variable_shard_config c;
  c.index = 1;
  c.pieces = {{"a", tensor::from<float>({3}, {1, 2, 3})},
              {"b", tensor::from<float>({2, 2}, {1, 1, 1, 1})}};
  c.optimizer = std::move(opt);
  c.total_steps = 100;
  c.aggregate = aggregate;
  return c;
}

std::vector<named_tensor> grads(const fvec& a, const fvec& b) {
  return {{"a", tensor::from<float>({3}, a)}, {"b", tensor::from<float>({2, 2}, b)}};
}

fvec values(const tensor& t) {
  return {t.f32(), t.f32() + t.numel()};
}

caf::expected<shard_values> pull(caf::scoped_actor& self, const variable_shard_actor& s,
                                 std::vector<std::string> names = {}) {
  caf::expected<shard_values> r{caf::error{}};
  self->request(s, timeout, pull_atom::value, std::move(names))
      .receive([&](shard_values& v) { r = std::move(v); }, [&](caf::error& e) { r = e; });
  return r;
}

caf::expected<int64_t> push(caf::scoped_actor& self, const variable_shard_actor& s, int64_t worker,
                            int64_t step, int64_t based_on, std::vector<named_tensor> g) {
  caf::expected<int64_t> r{caf::error{}};
  self->request(s, timeout, push_atom::value, worker, step, based_on, std::move(g))
      .receive([&](int64_t v) { r = v; }, [&](caf::error& e) { r = e; });
  return r;
}

shard_stats stats(caf::scoped_actor& self, const variable_shard_actor& s) {
  shard_stats r;
  self->request(s, timeout, stats_atom::value)
      .receive([&](shard_stats& x) { r = std::move(x); },
               [&](caf::error& e) { FAIL("stats: " << describe(e)); });
  return r;
}

const tensor& value_of(const shard_values& v, const std::string& name) {
  for (const auto& x : v.values)
    if (x.name == name) return x.value;
  throw std::runtime_error("no value " + name);
}

std::string error_text(const caf::expected<int64_t>& r) {
  return r ? "no error" : describe(r.error());
}

}  // namespace

TEST_CASE("push applies SGD on arrival; pull returns the new values and version") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, two_pieces(sgd(0.5)));
  auto v0 = pull(f.self, s);
  REQUIRE(v0);
  CHECK(v0->version == 0);
  REQUIRE(v0->values.size() == 2);
  CHECK(v0->values[0].name == "a");
  CHECK(values(value_of(*v0, "a")) == fvec{1, 2, 3});

  // w -= 0.5 * g; pieces may come in any order.
  auto g = grads({2, 4, -2}, {1, 0, 0, 1});
  std::swap(g[0], g[1]);
  auto r = push(f.self, s, 0, 0, 0, g);
  REQUIRE(r);
  CHECK(*r == 1);
  auto v1 = pull(f.self, s);
  REQUIRE(v1);
  CHECK(v1->version == 1);
  CHECK(values(value_of(*v1, "a")) == fvec{0, 0, 4});
  CHECK(values(value_of(*v1, "b")) == fvec{0.5f, 1, 1, 0.5f});
  // What was pulled before is untouched by the update.
  CHECK(values(value_of(*v0, "a")) == fvec{1, 2, 3});
  // The pushed gradients are the pusher's: the shard did not write them.
  CHECK(values(g[1].value) == fvec{2, 4, -2});
  // Without an update in between, pulls share one buffer (no copy per pull).
  auto v1b = pull(f.self, s);
  CHECK(value_of(*v1b, "a").shares_buffer_with(value_of(*v1, "a")));
  REQUIRE(push(f.self, s, 0, 1, 1, grads({0, 0, 0}, {0, 0, 0, 0})));
  CHECK(values(value_of(*v1, "a")) == fvec{0, 0, 4});
  CHECK_FALSE(value_of(*pull(f.self, s), "a").shares_buffer_with(value_of(*v1, "a")));
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("subset pulls return only the named pieces, in the asked order") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, two_pieces(sgd(0.5)));
  auto b = pull(f.self, s, {"b"});
  REQUIRE(b);
  REQUIRE(b->values.size() == 1);
  CHECK(b->values[0].name == "b");
  auto ba = pull(f.self, s, {"b", "a"});
  REQUIRE(ba);
  REQUIRE(ba->values.size() == 2);
  CHECK(ba->values[1].name == "a");
  auto bad = pull(f.self, s, {"a", "zz"});
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()) ==
        "variable_shard 1: pull: no piece 'zz' on this shard (pieces: a, b)");
  auto st = stats(f.self, s);
  CHECK(st.pulls == 2);
  CHECK(st.rejected == 1);
  CHECK(st.bytes_out == 16 + 16 + 12);
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("async pushes apply in arrival order, one version each") {
  fixture f;
  optimizer_config mom;
  mom.kind = "momentum";
  mom.learning_rate = 1.0;
  mom.momentum = 0.5;
  variable_shard_config c;
  c.pieces = {{"w", tensor::from<float>({1}, {0})}};
  c.optimizer = mom;
  auto s = spawn_variable_shard(f.sys, c);
  // Sent back to back without waiting: g = 1 then g = 2 gives v = 1, w = -1;
  // v = 0.5 + 2 = 2.5, w = -3.5 (the other order would give -4).
  auto one = [&](float g) {
    return f.self->request(s, timeout, push_atom::value, int64_t{0}, int64_t{0}, int64_t{0},
                           std::vector<named_tensor>{{"w", tensor::from<float>({1}, {g})}});
  };
  auto h1 = one(1.0f);
  auto h2 = one(2.0f);
  std::vector<int64_t> versions;
  for (auto* h : {&h1, &h2})
    h->receive([&](int64_t v) { versions.push_back(v); },
               [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(versions == std::vector<int64_t>{1, 2});
  auto v = pull(f.self, s);
  CHECK(v->version == 2);
  CHECK(values(value_of(*v, "w")) == fvec{-3.5f});
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("aggregate mode: K pushes of a step are summed and applied once") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, two_pieces(sgd(0.25), 3));
  auto send = [&](int64_t worker, int64_t step, int64_t based, std::vector<named_tensor> g) {
    return f.self->request(s, timeout, push_atom::value, worker, step, based, std::move(g));
  };
  std::vector<int64_t> versions;
  auto collect = [&](auto& h) {
    h.receive([&](int64_t v) { versions.push_back(v); }, [&](caf::error& e) { FAIL(describe(e)); });
  };
  // Two of three pushes: nothing applied, nobody answered yet.
  auto h0 = send(0, 0, 0, grads({1, 2, 3}, {4, 0, 0, 4}));
  auto h1 = send(1, 0, 0, grads({1, 2, 3}, {4, 0, 0, 4}));
  CHECK(stats(f.self, s).version == 0);
  CHECK(stats(f.self, s).applies == 0);
  // The same worker twice in one step is an error (and not counted).
  CHECK(error_text(push(f.self, s, 1, 0, 0, grads({0, 0, 0}, {0, 0, 0, 0})))
            .find("(step 0): this worker already pushed for step 0") != std::string::npos);
  auto h2 = send(2, 0, 0, grads({2, 0, -1}, {0, 0, 0, 0}));
  collect(h0);
  collect(h1);
  collect(h2);
  CHECK(versions == std::vector<int64_t>{1, 1, 1});
  // Sum a: {4, 4, 5}, b: {8, 0, 0, 8}; w -= 0.25 * sum.
  auto v = pull(f.self, s);
  CHECK(v->version == 1);
  CHECK(values(value_of(*v, "a")) == fvec{0, 1, 1.75f});
  CHECK(values(value_of(*v, "b")) == fvec{-1, 1, 1, -1});
  auto st = stats(f.self, s);
  CHECK(st.applies == 1);
  CHECK(st.pushes == 3);
  CHECK(st.staleness_max == 0);

  // A late push for the applied step is refused.
  CHECK(error_text(push(f.self, s, 0, 0, 0, grads({0, 0, 0}, {0, 0, 0, 0})))
            .find("step 0 was already applied") != std::string::npos);

  // Fewer contributors (a worker was lost): the pending step completes.
  auto h3 = send(0, 1, 1, grads({4, 4, 4}, {0, 0, 0, 0}));
  auto h4 = send(1, 1, 1, grads({0, 4, 0}, {0, 0, 0, 0}));
  int64_t old_k = -1;
  f.self->request(s, timeout, aggregate_atom::value, int64_t{2})
      .receive([&](int64_t k) { old_k = k; }, [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(old_k == 3);
  versions.clear();
  collect(h3);
  collect(h4);
  CHECK(versions == std::vector<int64_t>{2, 2});
  CHECK(values(value_of(*pull(f.self, s), "a")) == fvec{-1, -1, 0.75f});
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("versions count updates; staleness is version at apply minus based-on version") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, two_pieces(sgd(0.5)));
  auto z = grads({0, 0, 0}, {0, 0, 0, 0});
  // Workers 0 and 1 both pulled version 0; worker 1 then pushes twice from it.
  CHECK(*push(f.self, s, 0, 0, 0, z) == 1);  // staleness 0
  CHECK(*push(f.self, s, 1, 0, 0, z) == 2);  // 1
  CHECK(*push(f.self, s, 1, 1, 0, z) == 3);  // 2
  CHECK(*push(f.self, s, 0, 1, 1, z) == 4);  // 2
  CHECK(*push(f.self, s, 0, 2, 4, z) == 5);  // 0
  auto st = stats(f.self, s);
  CHECK(st.version == 5);
  CHECK(st.pushes == 5);
  CHECK(st.applies == 5);
  CHECK(st.bytes_in == 5 * 28);
  CHECK(st.staleness_max == 2);
  CHECK(st.staleness_mean == doctest::Approx(1.0));
  REQUIRE(st.staleness_histogram.size() == 16);
  CHECK(st.staleness_histogram[0] == 2);  // 0
  CHECK(st.staleness_histogram[1] == 1);  // 1
  CHECK(st.staleness_histogram[2] == 2);  // 2..3
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("a push that does not fit the pieces is an error naming the piece; the shard goes on") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, two_pieces(sgd(0.5)));
  auto wrong_shape = grads({1, 1, 1}, {1, 1, 1, 1});
  wrong_shape[1].value = tensor({4});
  CHECK(error_text(push(f.self, s, 3, 7, 0, wrong_shape)) ==
        "variable_shard 1: push from worker 3 (step 7): gradient for piece 'b' is "
        "float32[4], the piece is float32[2, 2]");
  auto unknown = grads({1, 1, 1}, {1, 1, 1, 1});
  unknown.push_back({"c", tensor({1})});
  CHECK(error_text(push(f.self, s, 3, 7, 0, unknown)).find("gradient 'c' is for no piece") !=
        std::string::npos);
  auto missing = grads({1, 1, 1}, {1, 1, 1, 1});
  missing.pop_back();
  CHECK(error_text(push(f.self, s, 3, 7, 0, missing)).find("no gradient for piece 'b'") !=
        std::string::npos);
  auto twice = grads({1, 1, 1}, {1, 1, 1, 1});
  twice[1] = twice[0];
  CHECK(error_text(push(f.self, s, 3, 7, 0, twice)).find("piece 'a' appears twice") !=
        std::string::npos);
  auto ints = grads({1, 1, 1}, {1, 1, 1, 1});
  ints[0].value = tensor({3}, dtype::i32);
  CHECK(error_text(push(f.self, s, 3, 7, 0, ints)).find("piece 'a' is int32[3]") !=
        std::string::npos);
  CHECK(error_text(push(f.self, s, 3, 7, 5, grads({1, 1, 1}, {1, 1, 1, 1})))
            .find("based on version 5, the shard is at version 0") != std::string::npos);
  // Nothing was applied; a good push still works.
  CHECK(*push(f.self, s, 3, 7, 0, grads({2, 2, 2}, {0, 0, 0, 0})) == 1);
  CHECK(values(value_of(*pull(f.self, s), "a")) == fvec{0, 1, 2});
  auto st = stats(f.self, s);
  CHECK(st.rejected == 6);
  CHECK(st.pushes == 1);
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("state and restore round-trip variables, optimizer slots and version") {
  fixture f;
  optimizer_config adam;
  adam.kind = "adam";
  adam.learning_rate = 0.1;
  auto a = spawn_variable_shard(f.sys, two_pieces(adam));
  REQUIRE(push(f.self, a, 0, 0, 0, grads({1, -2, 3}, {0.5f, 1, -1, 2})));
  REQUIRE(push(f.self, a, 0, 1, 1, grads({-1, 2, 0}, {1, 1, 1, 1})));
  shard_state snap;
  f.self->request(a, timeout, state_atom::value)
      .receive([&](shard_state& x) { snap = std::move(x); },
               [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(snap.version == 2);
  REQUIRE(snap.variables.size() == 2);
  auto snap_a = values(snap.variables[0].value);
  bool has_m = false;
  for (const auto& x : snap.slots) has_m = has_m || x.name == "a/adam_m";
  CHECK(has_m);

  // The snapshot does not move with later updates.
  auto g3 = grads({0.25f, 0.5f, -0.75f}, {2, -2, 1, 0});
  REQUIRE(push(f.self, a, 0, 2, 2, g3));
  CHECK(values(snap.variables[0].value) == snap_a);
  auto after_a = pull(f.self, a);

  // A fresh shard restored from the snapshot takes the same third step.
  auto b = spawn_variable_shard(f.sys, two_pieces(adam));
  int64_t restored = -1;
  f.self->request(b, timeout, restore_atom::value, snap)
      .receive([&](int64_t v) { restored = v; }, [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(restored == 2);
  CHECK(values(value_of(*pull(f.self, b), "a")) == snap_a);
  CHECK(*push(f.self, b, 0, 2, 2, g3) == 3);
  auto after_b = pull(f.self, b);
  for (const auto& n : {"a", "b"}) CHECK(value_of(*after_b, n) == value_of(*after_a, n));

  // Restoring pieces of another shape is an error naming the piece.
  auto bad = snap;
  bad.variables[1].value = tensor({3});
  caf::error err;
  f.self->request(b, timeout, restore_atom::value, bad)
      .receive([&](int64_t) {}, [&](caf::error& e) { err = e; });
  CHECK(describe(err) ==
        "variable_shard 1: restore: piece 'b' is float32[3], expected float32[2, 2]");
  bad = snap;
  bad.slots.pop_back();  // optimizer/step
  f.self->request(b, timeout, restore_atom::value, bad)
      .receive([&](int64_t) {}, [&](caf::error& e) { err = e; });
  CHECK(describe(err).find("optimizer/step") != std::string::npos);
  CHECK(pull(f.self, b)->version == 3);  // unchanged by the failed restores
  f.self->send_exit(a, caf::exit_reason::user_shutdown);
  f.self->send_exit(b, caf::exit_reason::user_shutdown);
}

TEST_CASE("restore drops pending aggregate steps with an error") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, two_pieces(sgd(0.5), 2));
  shard_state snap;
  f.self->request(s, timeout, state_atom::value)
      .receive([&](shard_state& x) { snap = std::move(x); },
               [&](caf::error& e) { FAIL(describe(e)); });
  auto hp = f.self->request(s, timeout, push_atom::value, int64_t{0}, int64_t{0}, int64_t{0},
                            grads({1, 1, 1}, {1, 1, 1, 1}));
  auto hr = f.self->request(s, timeout, restore_atom::value, snap);
  caf::error dropped;
  hp.receive([&](int64_t) { FAIL("the pending push was answered with a version"); },
             [&](caf::error& e) { dropped = e; });
  CHECK(describe(dropped).find("step 0 was dropped") != std::string::npos);
  hr.receive([&](int64_t v) { CHECK(v == 0); }, [&](caf::error& e) { FAIL(describe(e)); });
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("spawn_variable_shard rejects bad configurations") {
  fixture f;
  auto c = two_pieces(sgd(0.1));
  c.optimizer.kind = "adagrad";
  CHECK_THROWS_AS(spawn_variable_shard(f.sys, c), std::invalid_argument);
  c = two_pieces(sgd(0.1));
  c.pieces[1].value = tensor({2}, dtype::i64);
  CHECK_THROWS_WITH(spawn_variable_shard(f.sys, c),
                    "variable_shard 1: piece 'b' is int64, expected float32");
  c = two_pieces(sgd(0.1));
  c.pieces[1].name = "a";
  CHECK_THROWS_WITH(spawn_variable_shard(f.sys, c), "variable_shard 1: piece 'a' given twice");
  c = two_pieces(sgd(0.1), -1);
  CHECK_THROWS_AS(spawn_variable_shard(f.sys, c), std::invalid_argument);
  // A detached shard speaks the same protocol.
  c = two_pieces(sgd(0.5));
  c.detached = true;
  auto s = spawn_variable_shard(f.sys, c);
  CHECK(*push(f.self, s, 0, 0, 0, grads({2, 4, -2}, {1, 0, 0, 1})) == 1);
  CHECK(values(value_of(*pull(f.self, s), "a")) == fvec{0, 0, 4});
  f.self->send_exit(s, caf::exit_reason::user_shutdown);
}

TEST_CASE("shard messages serialize (they cross process boundaries)") {
  fixture f;
  shard_state st{
      7, grads({1, 2, 3}, {4, 5, 6, 7}), {{"optimizer/step", tensor::from<int64_t>({1}, {7})}}};
  shard_stats stx;
  stx.pushes = 3;
  stx.staleness_mean = 0.5;
  stx.staleness_histogram = {1, 2};
  std::vector<char> buf;
  caf::binary_serializer sink{f.sys, buf};
  REQUIRE(!sink(st, stx, shard_values{4, grads({1, 1, 1}, {2, 2, 2, 2})}));
  shard_state st2;
  shard_stats stx2;
  shard_values sv2;
  caf::binary_deserializer src{f.sys, buf};
  REQUIRE(!src(st2, stx2, sv2));
  CHECK(st2.version == 7);
  CHECK(st2.variables == st.variables);
  CHECK(st2.slots == st.slots);
  CHECK(stx2.pushes == 3);
  CHECK(stx2.staleness_histogram == std::vector<int64_t>{1, 2});
  CHECK(sv2.version == 4);
  CHECK(values(sv2.values[1].value) == fvec{2, 2, 2, 2});
}

namespace {

caf::expected<int64_t> exchange(caf::scoped_actor& self, const variable_shard_actor& s,
                                int64_t worker, int64_t round, int64_t based_on,
                                std::vector<named_tensor> d) {
  caf::expected<int64_t> r{caf::error{}};
  self->request(s, timeout, exchange_atom::value, worker, round, based_on, std::move(d))
      .receive([&](int64_t v) { r = v; }, [&](caf::error& e) { r = e; });
  return r;
}

variable_shard_config center(int64_t aggregate = 0) {
  auto c = two_pieces(sgd(0.001), aggregate);
  c.center = true;
  return c;
}

}  // namespace

TEST_CASE("a center shard adds exchanges exactly (c += d), no optimizer") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, center());
  // Values whose sums round: c + d must be the float sum, bit for bit.
  const fvec da = {0.1f, -2.5e-8f, 3.3f}, db = {1e-7f, -0.7f, 0.25f, 1.0f / 3};
  auto r = exchange(f.self, s, 0, 0, 0, grads(da, db));
  REQUIRE(r);
  CHECK(*r == 1);
  auto v = pull(f.self, s);
  REQUIRE(v);
  const fvec a0 = {1, 2, 3};
  for (std::size_t i = 0; i < 3; ++i) CHECK(values(value_of(*v, "a"))[i] == a0[i] + da[i]);
  for (std::size_t i = 0; i < 4; ++i) CHECK(values(value_of(*v, "b"))[i] == 1.0f + db[i]);
  auto st = stats(f.self, s);
  CHECK(st.pushes == 1);
  CHECK(st.applies == 1);
}

TEST_CASE("a center shard in aggregate mode sums a round's exchanges, then adds them once") {
  fixture f;
  auto s = spawn_variable_shard(f.sys, center(2));
  auto p1 = f.self->request(s, timeout, exchange_atom::value, int64_t{0}, int64_t{0}, int64_t{0},
                            grads({1, 1, 1}, {0.5f, 0, 0, 0}));
  auto before = pull(f.self, s);
  REQUIRE(before);
  CHECK(before->version == 0);  // one of two exchanges: nothing applied yet
  auto r2 = exchange(f.self, s, 1, 0, 0, grads({2, 2, 2}, {0.25f, 0, 0, 0}));
  REQUIRE(r2);
  CHECK(*r2 == 1);
  p1.receive([](int64_t v) { CHECK(v == 1); },
             [](caf::error& e) { FAIL("first exchange: " << describe(e)); });
  auto v = pull(f.self, s);
  REQUIRE(v);
  CHECK(values(value_of(*v, "a")) == fvec{4, 5, 6});
  CHECK(values(value_of(*v, "b"))[0] == 1.75f);
  // A worker was dropped after round 1 was applied without it: its late
  // exchange for round 1 is applied alone (exchanges add up).
  f.self->request(s, timeout, aggregate_atom::value, int64_t{1})
      .receive([](int64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(exchange(f.self, s, 0, 1, 1, grads({1, 0, 0}, {0, 0, 0, 0})));
  auto late = exchange(f.self, s, 1, 1, 1, grads({0, 1, 0}, {0, 0, 0, 0}));
  REQUIRE(late);
  CHECK(*late == 3);
  auto w = pull(f.self, s);
  REQUIRE(w);
  CHECK(values(value_of(*w, "a")) == fvec{5, 6, 6});
}

TEST_CASE("exchanges and pushes go only to their kind of shard, refused naming the shard") {
  fixture f;
  auto c = spawn_variable_shard(f.sys, center());
  auto r = push(f.self, c, 2, 0, 0, grads({1, 1, 1}, {1, 1, 1, 1}));
  REQUIRE_FALSE(r);
  CHECK(error_text(r).find("variable_shard 1: push from worker 2 (step 0): this shard holds the "
                           "elastic averaging center") != std::string::npos);
  auto g = spawn_variable_shard(f.sys, two_pieces(sgd(0.5)));
  auto e = exchange(f.self, g, 3, 4, 0, grads({1, 1, 1}, {1, 1, 1, 1}));
  REQUIRE_FALSE(e);
  CHECK(error_text(e).find("variable_shard 1: exchange from worker 3 (round 4): this shard's "
                           "variables are updated by gradients") != std::string::npos);
  // Neither was applied.
  CHECK(pull(f.self, c)->version == 0);
  CHECK(pull(f.self, g)->version == 0);
}
