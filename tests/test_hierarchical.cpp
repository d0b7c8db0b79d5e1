// The hierarchical reducer (actors/reducers/hierarchical.hpp), with P
// "processes" simulated in one process: P ring nodes, P in-process reducer
// groups and one hierarchical reducer per replica. Inputs are small integers,
// so sums, mins and maxes are exact and the mean is exactly the documented
// float(sum) * (1 / replicas).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/reducer.hpp"
#include "actors/reducers/hierarchical.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "actors/system_config.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

const reduce_op all_ops[] = {reduce_op::sum, reduce_op::mean, reduce_op::min, reduce_op::max};

// Odd sizes (not multiples of group sizes, chunks or buckets), a zero-element
// tensor, and tensors spanning several ring chunks and local buckets with the
// small sizes below.
const std::vector<shape_t> shapes{{1}, {7}, {3, 5}, {0}, {130}, {2, 129}, {11}};

using result_t = caf::expected<std::vector<tensor>>;

std::string why(const result_t& r) {
  return r ? std::string{} : describe(r.error());
}

// P processes with sizes[p] replicas each; replica g (global index) is local
// rank rank_of[g] of process process_of[g].
struct world {
  system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<ring_node_actor> rings;
  std::vector<std::vector<reducer_actor>> locals;
  std::vector<reducer_actor> hier;
  std::vector<int> process_of;
  std::vector<int> rank_of;

  // use_ring = false: a single process without a ring node.
  explicit world(const std::vector<int>& sizes, bool use_ring = true, caf::timespan timeout = 30s) {
    const int p = static_cast<int>(sizes.size());
    ring_options ro;
    ro.chunk_bytes = 64;  // 16 floats: many chunks per collective
    ro.window = 4;
    ro.timeout = timeout;
    if (use_ring) rings = spawn_ring_group(sys, p, ro);
    reducer_config rc;
    rc.bucket_bytes = 512;  // 128 floats
    rc.chunk_bytes = 40;
    int64_t total = 0;
    for (int s : sizes) total += s;
    for (int q = 0; q < p; ++q) {
      locals.push_back(spawn_reducer_group(sys, sizes[static_cast<std::size_t>(q)], rc));
      for (int r = 0; r < sizes[static_cast<std::size_t>(q)]; ++r) {
        hierarchical_config hc;
        hc.local = locals.back()[static_cast<std::size_t>(r)];
        hc.local_rank = r;
        if (r == 0 && use_ring) hc.ring = rings[static_cast<std::size_t>(q)];
        hc.global_replicas = total;
        hc.timeout = timeout;
        hier.push_back(spawn_hierarchical_reducer(sys, hc));
        process_of.push_back(q);
        rank_of.push_back(r);
      }
    }
  }
  ~world() {
    for (auto& h : hier) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
    for (auto& g : locals)
      for (auto& h : g) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
    stop_ring_nodes(rings);
  }
  int replicas() const { return static_cast<int>(hier.size()); }
};

float value(int g, int k, std::size_t t, int64_t i) {
  return static_cast<float>((g * 7 + k * 5 + static_cast<int64_t>(t) * 3 + i) % 11 - 5);
}

// Replica g's input of collective k.
std::vector<tensor> input(int g, int k, const std::vector<shape_t>& ss = shapes) {
  std::vector<tensor> ts;
  for (std::size_t t = 0; t < ss.size(); ++t) {
    tensor x(ss[t]);
    auto v = x.span<float>();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(g, k, t, static_cast<int64_t>(i));
    ts.push_back(x);
  }
  return ts;
}

std::vector<float> expected(int replicas, int k, std::size_t t, int64_t numel, reduce_op op) {
  std::vector<float> out(static_cast<std::size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    float acc = value(0, k, t, i);
    for (int g = 1; g < replicas; ++g) {
      float x = value(g, k, t, i);
      if (op == reduce_op::min)
        acc = std::min(acc, x);
      else if (op == reduce_op::max)
        acc = std::max(acc, x);
      else
        acc += x;
    }
    if (op == reduce_op::mean) acc *= 1.0f / static_cast<float>(replicas);
    out[static_cast<std::size_t>(i)] = acc;
  }
  return out;
}

// One call: replica `g`'s tensors for one collective.
struct call {
  int g = 0;
  reduce_op op = reduce_op::sum;
  std::vector<tensor> tensors;
};

// Sends every call before receiving any reply (a reducer sees its calls in
// the order given); returns the results in the same order.
std::vector<result_t> run(world& w, std::vector<call> calls, caf::timespan timeout = 60s) {
  caf::scoped_actor self{w.sys};
  using handle_t = decltype(self->request(w.hier[0], timeout, allreduce_atom::value, reduce_op::sum,
                                          std::vector<tensor>{}));
  std::vector<handle_t> hs;
  for (auto& c : calls)
    hs.push_back(self->request(w.hier[static_cast<std::size_t>(c.g)], timeout,
                               allreduce_atom::value, c.op, std::move(c.tensors)));
  std::vector<result_t> out;
  for (auto& h : hs)
    h.receive([&](std::vector<tensor>& ts) { out.emplace_back(std::move(ts)); },
              [&](caf::error& e) { out.emplace_back(std::move(e)); });
  return out;
}

// One collective on every replica.
std::vector<result_t> run_all(world& w, reduce_op op, int k) {
  std::vector<call> calls;
  for (int g = 0; g < w.replicas(); ++g) calls.push_back({g, op, input(g, k)});
  return run(w, std::move(calls));
}

bool same_bits(const std::vector<tensor>& a, const std::vector<tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t t = 0; t < a.size(); ++t)
    if (a[t].shape() != b[t].shape() ||
        (a[t].nbytes() > 0 && std::memcmp(a[t].raw(), b[t].raw(), a[t].nbytes()) != 0))
      return false;
  return true;
}

// Every replica's result of collective k equals the expected values, in the
// caller's own buffers, bit-identical on every replica.
void check_collective(const world& w, const std::vector<result_t>& res,
                      const std::vector<std::vector<tensor>>& inputs, int k, reduce_op op) {
  CAPTURE(k);
  const std::string op_name = reduce_op_name(op);
  CAPTURE(op_name);
  REQUIRE(static_cast<int>(res.size()) == w.replicas());
  for (int g = 0; g < w.replicas(); ++g) {
    CAPTURE(g);
    const auto& r = res[static_cast<std::size_t>(g)];
    REQUIRE_MESSAGE(r, why(r));
    REQUIRE(r->size() == shapes.size());
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const tensor& got = (*r)[t];
      // In place (an empty tensor has no buffer to share).
      if (!got.empty()) CHECK(got.shares_buffer_with(inputs[static_cast<std::size_t>(g)][t]));
      REQUIRE(got.shape() == shapes[t]);
      auto ref = expected(w.replicas(), k, t, got.numel(), op);
      for (int64_t i = 0; i < got.numel(); ++i)
        if (got.f32()[i] != ref[static_cast<std::size_t>(i)])
          FAIL_CHECK("tensor ", t, "[", i, "] = ", got.f32()[i], ", expected ",
                     ref[static_cast<std::size_t>(i)]);
    }
    CHECK(same_bits(*r, *res[0]));
  }
}

// Every op, then several collectives in a row issued without waiting.
void check_world(world& w) {
  int k = 0;
  for (auto op : all_ops) {
    std::vector<std::vector<tensor>> ins;
    std::vector<call> calls;
    for (int g = 0; g < w.replicas(); ++g) {
      ins.push_back(input(g, k));
      calls.push_back({g, op, ins.back()});
    }
    check_collective(w, run(w, std::move(calls)), ins, k, op);
    ++k;
  }
  // Rounds of all four ops, every call sent up front, replica by replica:
  // each reducer queues its later calls behind the one in flight.
  const int rounds = 8;
  std::vector<std::vector<std::vector<tensor>>> ins(rounds);
  std::vector<call> calls;
  for (int g = 0; g < w.replicas(); ++g)
    for (int j = 0; j < rounds; ++j) {
      ins[static_cast<std::size_t>(j)].push_back(input(g, k + j));
      calls.push_back({g, all_ops[j % 4], ins[static_cast<std::size_t>(j)].back()});
    }
  auto res = run(w, std::move(calls));
  for (int j = 0; j < rounds; ++j) {
    std::vector<result_t> col;
    for (int g = 0; g < w.replicas(); ++g)
      col.push_back(std::move(res[static_cast<std::size_t>(g * rounds + j)]));
    check_collective(w, col, ins[static_cast<std::size_t>(j)], k + j, all_ops[j % 4]);
  }
}

reducer_stats stats_of(world& w, int g) {
  caf::scoped_actor self{w.sys};
  reducer_stats s;
  self->request(w.hier[static_cast<std::size_t>(g)], 10s, stats_atom::value)
      .receive([&](reducer_stats& x) { s = x; },
               [&](caf::error& e) { FAIL("stats: ", describe(e)); });
  return s;
}

// Every result failed, each with a text containing `needle(g)`.
template <class F>
void expect_all_fail(const std::vector<result_t>& res, F needle) {
  for (std::size_t g = 0; g < res.size(); ++g) {
    CAPTURE(g);
    REQUIRE_FALSE(res[g]);
    auto text = why(res[g]);
    CHECK_MESSAGE(text.find("hierarchical all-reduce: ") != std::string::npos, text);
    std::string n = needle(static_cast<int>(g));
    CHECK_MESSAGE(text.find(n) != std::string::npos, text, " (expected ", n, ")");
  }
}

int64_t payload_bytes() {
  int64_t n = 0;
  for (const auto& s : shapes) n += shape_numel(s);
  return n * static_cast<int64_t>(sizeof(float));
}

}  // namespace

TEST_CASE("hierarchical: processes {2, 1}: every op exact, bit-identical, back to back") {
  world w({2, 1});
  check_world(w);
  // 4 single collectives + 8 in a row, all counted here.
  for (int g = 0; g < w.replicas(); ++g) {
    auto s = stats_of(w, g);
    CHECK(s.collectives == 12);
    CHECK(s.failed == 0);
    CHECK(s.bytes_reduced == 12 * payload_bytes());
  }
}

TEST_CASE("hierarchical: processes {2, 2, 3}: every op exact, bit-identical, back to back") {
  world w({2, 2, 3});
  check_world(w);
}

TEST_CASE("hierarchical: one process, with a one-node ring and without a ring") {
  {
    world w({3});
    check_world(w);
  }
  {
    world w({3}, /*use_ring=*/false);
    check_world(w);
  }
  {
    world w({1, 1, 1});  // one replica per process: the ring does all the work
    check_world(w);
  }
}

TEST_CASE("hierarchical: an empty collective (only the status travels)") {
  world w({2, 2});
  std::vector<call> calls;
  for (int g = 0; g < w.replicas(); ++g) calls.push_back({g, reduce_op::mean, {}});
  for (auto& r : run(w, std::move(calls))) {
    REQUIRE_MESSAGE(r, why(r));
    CHECK(r->empty());
  }
}

TEST_CASE("hierarchical: a local mismatch fails every replica of every process; groups go on") {
  world w({2, 2, 3});
  auto t0 = std::chrono::steady_clock::now();
  // Process 1, local rank 1 (replica 3) has a different shape: process 1's
  // local stage fails, its rank 0 tells the others through the ring.
  auto bad = shapes;
  bad[2] = {4, 4};
  std::vector<call> calls;
  for (int g = 0; g < w.replicas(); ++g) calls.push_back({g, reduce_op::sum, input(g, 0)});
  calls[3].tensors = input(3, 0, bad);
  expect_all_fail(run(w, std::move(calls)), [&](int g) {
    return w.process_of[static_cast<std::size_t>(g)] == 1 ? "local all-reduce stage"
                                                          : "another process failed";
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  // Every group stayed in step: a good collective still works.
  std::vector<std::vector<tensor>> ins;
  std::vector<call> good;
  for (int g = 0; g < w.replicas(); ++g) {
    ins.push_back(input(g, 1));
    good.push_back({g, reduce_op::max, ins.back()});
  }
  check_collective(w, run(w, std::move(good)), ins, 1, reduce_op::max);
  auto s = stats_of(w, 0);
  CHECK(s.collectives == 2);
  CHECK(s.failed == 1);
}

TEST_CASE("hierarchical: sizes differing between processes fail every replica, no hang") {
  world w({2, 1});
  auto t0 = std::chrono::steady_clock::now();
  auto bad = shapes;
  bad[4] = {131};
  std::vector<call> calls;
  for (int g = 0; g < w.replicas(); ++g)
    calls.push_back({g, reduce_op::mean, input(g, 0, w.process_of[g] == 1 ? bad : shapes)});
  auto res = run(w, std::move(calls));
  expect_all_fail(res, [](int) { return "ring stage"; });
  // Local rank 0 names the ring's reason; the others point to it.
  CHECK_MESSAGE(why(res[0]).find("mismatch") != std::string::npos, why(res[0]));
  CHECK_MESSAGE(why(res[1]).find("failed on local rank 0") != std::string::npos, why(res[1]));
  // The ring is broken for good: the next collective fails at once too.
  expect_all_fail(run_all(w, reduce_op::sum, 1), [](int) { return "ring stage"; });
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("hierarchical: a dead ring node fails every caller, no hang") {
  {  // killed before the collective
    world w({2, 2, 1});
    caf::anon_send_exit(w.rings[1], caf::exit_reason::user_shutdown);
    auto t0 = std::chrono::steady_clock::now();
    expect_all_fail(run_all(w, reduce_op::sum, 0), [](int) { return "ring stage"; });
    expect_all_fail(run_all(w, reduce_op::sum, 1), [](int) { return "ring stage"; });
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
  // Process 1 never calls, so process 0's rank 0 waits in the ring stage when
  // a node dies: its own node (seen through the monitor) or the other one
  // (seen by its ring node).
  for (int victim : {0, 1}) {
    CAPTURE(victim);
    world w({3, 1});
    caf::scoped_actor self{w.sys};
    using handle_t = decltype(self->request(w.hier[0], 60s, allreduce_atom::value, reduce_op::sum,
                                            std::vector<tensor>{}));
    std::vector<handle_t> hs;
    for (int g = 0; g < 3; ++g)
      hs.push_back(self->request(w.hier[static_cast<std::size_t>(g)], 60s, allreduce_atom::value,
                                 reduce_op::sum, input(g, 0)));
    std::this_thread::sleep_for(100ms);
    auto t0 = std::chrono::steady_clock::now();
    caf::anon_send_exit(w.rings[static_cast<std::size_t>(victim)], caf::exit_reason::user_shutdown);
    for (auto& h : hs)
      h.receive([&](std::vector<tensor>&) { FAIL("a collective without process 1 succeeded"); },
                [&](caf::error& e) {
                  CHECK_MESSAGE(describe(e).find("ring stage") != std::string::npos, describe(e));
                });
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
}

TEST_CASE("hierarchical: broadcast, reduce_scatter and all_gather are refused") {
  world w({2, 1});
  caf::scoped_actor self{w.sys};
  auto refused = [&](const std::string& what) {
    return [&, what](caf::error& e) {
      CHECK_MESSAGE(
          describe(e).find(what + " is not supported across processes") != std::string::npos,
          describe(e));
    };
  };
  auto unexpected = [](std::vector<tensor>&) { FAIL("expected an error reply"); };
  self->request(w.hier[1], 10s, broadcast_atom::value, int32_t{0}, input(1, 0))
      .receive(unexpected, refused("broadcast"));
  self->request(w.hier[0], 10s, reduce_scatter_atom::value, reduce_op::sum, input(0, 0))
      .receive(unexpected, refused("reduce_scatter"));
  self->request(w.hier[2], 10s, all_gather_atom::value, input(2, 0))
      .receive(unexpected, refused("all_gather"));
  // Nothing reached the groups: an all-reduce still works.
  std::vector<std::vector<tensor>> ins;
  std::vector<call> calls;
  for (int g = 0; g < w.replicas(); ++g) {
    ins.push_back(input(g, 3));
    calls.push_back({g, reduce_op::min, ins.back()});
  }
  check_collective(w, run(w, std::move(calls)), ins, 3, reduce_op::min);
}

TEST_CASE("spawn_hierarchical_reducer refuses bad configurations") {
  system_config cfg;
  caf::actor_system sys{cfg};
  auto group = spawn_reducer_group(sys, 1, reducer_config{});
  hierarchical_config hc;
  CHECK_THROWS_AS(spawn_hierarchical_reducer(sys, hc), std::invalid_argument);
  hc.local = group[0];
  hc.global_replicas = 0;
  CHECK_THROWS_AS(spawn_hierarchical_reducer(sys, hc), std::invalid_argument);
  hc.global_replicas = 1;
  hc.local_rank = -1;
  CHECK_THROWS_AS(spawn_hierarchical_reducer(sys, hc), std::invalid_argument);
  for (auto& h : group) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
}
