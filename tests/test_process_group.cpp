// The collective layer (collectives/process_group.hpp) over its in-process
// backends: the host group, the reducer actors (actors/reducer_group.hpp)
// and the hierarchical composite (collectives/hierarchical_group.hpp) over
// either: the groups of a job across processes. Each
// rank runs on a thread of its own, as a replica's device thread does. The
// same calls give the same sums on every backend; work handles complete in
// order; a group aborted in the middle of a collective leaves no rank
// blocked, and the survivors re-form a group over themselves.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/reducer.hpp"
#include "actors/reducer_group.hpp"
#include "actors/system_config.hpp"
#include "collectives/hierarchical_group.hpp"
#include "collectives/process_group.hpp"
#include "tests/device_fixtures.hpp"

using namespace troupe;
using troupe::test::on_ranks;

namespace {

// Sums of these are exact in float (small integers), so every backend and
// every order must give the very same values.
std::vector<float> values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((static_cast<int>(i) * 7 + rank * 13) % 29 - 14);
  return v;
}

std::vector<float> sum_of(int ranks, std::size_t n) {
  std::vector<float> s(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    auto v = values(r, n);
    for (std::size_t i = 0; i < n; ++i) s[i] += v[i];
  }
  return s;
}

// Makes rank r's process_group of an n-rank group (on rank r's thread).
using group_maker = std::function<std::shared_ptr<process_group>(int rank)>;

struct host_backend {
  std::vector<std::shared_ptr<device_context>> ctx;
  std::shared_ptr<group_rendezvous> rendezvous;
  explicit host_backend(int n)
      : rendezvous(make_device_rendezvous(n, device_spec{device_spec::kind_t::cpu, 0})) {
    for (int r = 0; r < n; ++r)
      ctx.push_back(make_device_context(device_spec{device_spec::kind_t::cpu, r}));
  }
  group_maker maker() {
    return [this](int r) -> std::shared_ptr<process_group> {
      return rendezvous->join(r, *ctx[static_cast<std::size_t>(r)]);
    };
  }
};

struct actor_backend {
  system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<reducer_actor> reducers;
  actor_backend(int n, const std::string& algorithm) {
    reducer_config rc;
    rc.algorithm = algorithm;
    rc.bucket_bytes = 256;  // several buckets even for small buffers
    rc.chunk_bytes = 64;
    reducers = spawn_reducer_group(sys, n, rc);
  }
  ~actor_backend() {
    for (auto& r : reducers) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  }
  std::unique_ptr<process_group> group(int r) {
    reducer_group_options o;
    o.rank = r;
    o.size = static_cast<int>(reducers.size());
    o.coalesce_bytes = 256;  // the reducers' bucket: some batches go before the wait
    return make_reducer_group(
        sys, caf::actor_cast<caf::actor>(reducers[static_cast<std::size_t>(r)]), std::move(o));
  }
  group_maker maker() {
    return [this](int r) -> std::shared_ptr<process_group> { return group(r); };
  }
};

// What every backend must do alike: all_reduce, the spans in one call,
// reduce_scatter's chunk, all_gather, broadcast, and issued work.
void check_collectives(int n, const group_maker& make) {
  constexpr std::size_t count = 203;  // not a multiple of anything
  const auto sum = sum_of(n, count);
  auto errors = on_ranks(n, [&](int r) {
    auto g = make(r);
    CHECK(g->rank() == r);
    CHECK(g->size() == n);
    auto a = values(r, count);
    g->all_reduce(a.data(), count, reduce_op::sum);
    CHECK(a == sum);

    // Two spans as one buffer; the second starts off a 64-byte boundary.
    std::vector<float> spans(count + 1);
    auto v = values(r, count);
    std::copy(v.begin(), v.end(), spans.begin() + 1);
    g->all_reduce_spans({{spans.data(), 1}, {spans.data() + 1, count}}, reduce_op::sum);
    CHECK(std::vector<float>(spans.begin() + 1, spans.end()) == sum);

    const std::size_t chunk = 17;
    auto rs = values(r, chunk * static_cast<std::size_t>(n));
    g->reduce_scatter(rs.data(), chunk, reduce_op::sum);
    const auto rs_sum = sum_of(n, chunk * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < chunk; ++i)
      CHECK(rs[static_cast<std::size_t>(r) * chunk + i] ==
            rs_sum[static_cast<std::size_t>(r) * chunk + i]);

    std::vector<float> ag(chunk * static_cast<std::size_t>(n), -1.0f);
    for (std::size_t i = 0; i < chunk; ++i)
      ag[static_cast<std::size_t>(r) * chunk + i] =
          static_cast<float>(r * 100 + static_cast<int>(i));
    g->all_gather(ag.data(), chunk);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < chunk; ++i)
        CHECK(ag[static_cast<std::size_t>(p) * chunk + i] ==
              static_cast<float>(p * 100 + static_cast<int>(i)));

    auto bc = values(r, 31);
    g->broadcast(bc.data(), bc.size(), n - 1);
    CHECK(bc == values(n - 1, 31));

    // Issued: three in flight, the second waited for, then the rest.
    auto x = values(r, 64), y = values(r, 65), z = values(r, 66);
    g->issue_all_reduce(x.data(), x.size(), reduce_op::sum);
    auto wy = g->issue_all_reduce(y.data(), y.size(), reduce_op::sum);
    g->issue_all_reduce(z.data(), z.size(), reduce_op::sum);
    wy.wait();
    CHECK(x == sum_of(n, 64));
    CHECK(y == sum_of(n, 65));
    g->complete();
    CHECK(z == sum_of(n, 66));
  });
  for (const auto& e : errors) CHECK(e == "");
}

// ZeRO-1 in the backend's layout: the owned elements, reduced after the
// reduce-scatter (issued a variable at a time, from the last, as backward
// does), then each rank's owned elements written and gathered to all.
void check_shards(int n, const group_maker& make) {
  const std::vector<std::size_t> sizes{300, 7, 64, 1001};  // some the ranks divide, some not
  std::size_t total = 0;
  for (auto z : sizes) total += z;
  const auto sum = sum_of(n, total);
  std::vector<process_group::element_ranges> owned(static_cast<std::size_t>(n));
  std::vector<std::vector<float>> after(static_cast<std::size_t>(n));
  auto errors = on_ranks(n, [&](int r) {
    auto g = make(r);
    auto data = values(r, total);
    std::vector<float_span> spans;
    std::size_t at = 0;
    for (auto z : sizes) {
      spans.push_back({data.data() + at, z});
      at += z;
    }
    auto mine = g->shard_ranges(spans);
    for (std::size_t i = spans.size(); i-- > 0;)
      g->issue_reduce_scatter_spans({spans[i]}, reduce_op::sum);
    g->complete();
    for (auto [a, b] : mine)
      for (auto e = a; e < b; ++e) {
        CHECK(data[static_cast<std::size_t>(e)] == sum[static_cast<std::size_t>(e)]);
        data[static_cast<std::size_t>(e)] =
            static_cast<float>(1000 * (r + 1)) + static_cast<float>(e);
      }
    g->issue_all_gather_spans(spans);
    g->complete();
    owned[static_cast<std::size_t>(r)] = mine;
    after[static_cast<std::size_t>(r)] = data;
  });
  for (const auto& e : errors) CHECK(e == "");
  // Every element is owned by one rank, or by all of them; every rank ends
  // with the owner's value (any owner's where all own it: they wrote alike
  // but for the rank term, so check those against the sum's ownership).
  std::vector<int> owners(total, 0);
  std::vector<int> owner(total, -1);
  for (int r = 0; r < n; ++r)
    for (auto [a, b] : owned[static_cast<std::size_t>(r)])
      for (auto e = a; e < b; ++e) {
        ++owners[static_cast<std::size_t>(e)];
        owner[static_cast<std::size_t>(e)] = r;
      }
  for (std::size_t e = 0; e < total; ++e) {
    CAPTURE(e);
    REQUIRE((owners[e] == 1 || owners[e] == n));
    if (owners[e] != 1) continue;
    const float want = static_cast<float>(1000 * (owner[e] + 1)) + static_cast<float>(e);
    for (int r = 0; r < n; ++r) CHECK(after[static_cast<std::size_t>(r)][e] == want);
  }
}

// Ranks 0..n-2 all-reduce while the last rank aborts the group instead of
// taking part: every survivor's collective throws (none is left blocked),
// then the survivors form a group of n-1 over themselves and all-reduce.
void check_abort_and_reform(int n, const group_maker& make, const group_maker& make_survivors) {
  std::atomic<int> failed{0};
  auto errors = on_ranks(n, [&](int r) {
    auto g = make(r);
    if (r == n - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting
      g->abort("rank " + std::to_string(r) + " is lost");
      return;
    }
    auto a = values(r, 100);
    try {
      g->all_reduce(a.data(), a.size(), reduce_op::sum);
    } catch (const device_error& e) {
      // The cause names the lost rank (the host group: the abort's reason;
      // the actors: its reducer, which the others saw go down).
      CHECK(std::string(e.what()).find("rank " + std::to_string(n - 1)) != std::string::npos);
      ++failed;
    }
    // The group stays failed: the next collective fails at once too, it
    // does not wait for the rank that left.
    CHECK_THROWS_AS(g->all_reduce(a.data(), a.size(), reduce_op::sum), device_error);
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK(failed.load() == n - 1);

  const int survivors = n - 1;
  errors = on_ranks(survivors, [&](int r) {
    auto g = make_survivors(r);
    CHECK(g->size() == survivors);
    auto a = values(r, 100);
    g->all_reduce(a.data(), a.size(), reduce_op::sum);
    CHECK(a == sum_of(survivors, 100));
  });
  for (const auto& e : errors) CHECK(e == "");
}

}  // namespace

TEST_CASE("the host group and the reducer actors give the same collectives through one interface") {
  SUBCASE("host group") {
    host_backend b(3);
    check_collectives(3, b.maker());
  }
  for (const char* algorithm : {"ring", "tree", "reduce_to_one"}) {
    SUBCASE(algorithm) {
      actor_backend b(3, algorithm);
      check_collectives(3, b.maker());
    }
  }
}

TEST_CASE("ZeRO-1 through the interface: each backend's own layout, reduced and gathered") {
  SUBCASE("host group: a chunk per rank of each variable the ranks divide") {
    host_backend b(2);
    check_shards(2, b.maker());
  }
  SUBCASE("reducer actors: their segments") {
    actor_backend b(3, "ring");
    check_shards(3, b.maker());
  }
}

TEST_CASE("a group aborted mid-collective frees every rank, and the survivors re-form it") {
  SUBCASE("host group") {
    host_backend first(3), second(2);
    check_abort_and_reform(3, first.maker(), second.maker());
  }
  SUBCASE("reducer actors") {
    actor_backend first(3, "ring"), second(2, "ring");
    check_abort_and_reform(3, first.maker(), second.maker());
  }
}

TEST_CASE("a rank that stops waiting frees its buffers, and a peer still reads live memory") {
  // Rank 0 issues an all-reduce, stops waiting (as a replica that ends) and
  // drops its buffer before rank 1 has even issued: rank 1's reducer reads
  // rank 0's buffer after that. The group was told the buffer's owner, so
  // the memory lives until the reducers let go of it.
  constexpr std::size_t count = 192;  // whole cache lines: aligned_alloc's size
  std::atomic<bool> freed{false}, dropped{false};
  {
    actor_backend b(2, "ring");
    auto errors = on_ranks(2, [&](int r) {
      reducer_group_options o;
      o.rank = r;
      o.size = 2;
      o.coalesce_bytes = 1;  // sent at the issue
      std::vector<tensor> owned;
      o.buffer_owners = [&owned](const float* p, std::size_t) -> std::shared_ptr<const void> {
        for (const auto& t : owned)
          if (t.f32() == p) return std::make_shared<const tensor>(t);
        return nullptr;
      };
      auto g = make_reducer_group(
          b.sys, caf::actor_cast<caf::actor>(b.reducers[static_cast<std::size_t>(r)]), o);
      const shape_t shape{static_cast<int64_t>(count)};
      if (r == 0) {
        void* mem = std::aligned_alloc(64, count * sizeof(float));
        owned.push_back(tensor::wrap(shape, dtype::f32, std::shared_ptr<void>(mem, [&](void* q) {
                                       freed = true;
                                       std::free(q);
                                     })));
        auto v = values(0, count);
        std::copy(v.begin(), v.end(), owned[0].f32());
        auto w = g->issue_all_reduce(owned[0].f32(), count, reduce_op::sum);
        g->stop_waiting("rank 0 stopped");
        CHECK_THROWS_WITH_AS(w.wait(), doctest::Contains("rank 0 stopped"), device_error);
        owned.clear();
        CHECK_FALSE(freed.load());  // rank 1's reducer has not read it yet
        dropped = true;
        return;
      }
      while (!dropped) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      auto a = values(1, count);
      g->all_reduce(a.data(), count, reduce_op::sum);
      CHECK(a == sum_of(2, count));
    });
    for (const auto& e : errors) CHECK(e == "");
  }
  CHECK(freed.load());  // and the reducers held it no longer than they lived
}

TEST_CASE("the hierarchical group sums over processes as one flat group does") {
  // Two "processes" of two replicas each: a host group in each, and a host
  // group of the two first replicas standing for the links between them.
  constexpr int per_process = 2, processes = 2, n = per_process * processes;
  std::vector<std::unique_ptr<host_backend>> local;
  for (int p = 0; p < processes; ++p) local.push_back(std::make_unique<host_backend>(per_process));
  host_backend across(processes);
  auto make = [&](int r) {
    const int p = r / per_process, k = r % per_process;
    auto& in_process = *local[static_cast<std::size_t>(p)];
    std::shared_ptr<process_group> links;
    if (k == 0) links = across.maker()(p);
    hierarchical_options o;
    o.rank = r;
    o.size = n;
    return make_hierarchical_group(
        in_process.rendezvous->join(k, *in_process.ctx[static_cast<std::size_t>(k)]), links, o);
  };
  auto errors = on_ranks(n, [&](int r) {
    auto g = make(r);
    CHECK(g->size() == n);
    // Per layer, as a step issues them, then one wait.
    auto a = values(r, 100), b = values(r, 37);
    g->issue_all_reduce(b.data(), b.size(), reduce_op::sum);
    g->issue_all_reduce(a.data(), a.size(), reduce_op::mean);
    g->complete();
    CHECK(b == sum_of(n, 37));
    auto mean = sum_of(n, 100);
    for (auto& x : mean) x *= 1.0f / static_cast<float>(n);
    CHECK(a == mean);
  });
  for (const auto& e : errors) CHECK(e == "");

  SUBCASE("only the process's first replica holds the links") {
    host_backend fresh(per_process), fresh_across(processes);
    hierarchical_options o;
    o.rank = 1;
    o.size = n;
    CHECK_THROWS_WITH_AS(make_hierarchical_group(fresh.rendezvous->join(1, *fresh.ctx[1]),
                                                 fresh_across.maker()(1), o),
                         doctest::Contains("is not its process's first replica"), device_error);
  }
}

namespace {

// Processes of reducer actors, joined by a reducer group of the processes'
// first replicas standing for the ring nodes between them: the groups a
// mirrored job across processes on the ring, tree or reduce_to_one gets.
struct actor_processes {
  std::vector<int> sizes;  // replicas per process
  std::vector<std::unique_ptr<actor_backend>> local;
  std::unique_ptr<actor_backend> across;
  std::vector<int> process_of, local_rank_of;
  actor_processes(std::vector<int> per_process, const std::string& algorithm)
      : sizes(std::move(per_process)) {
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      local.push_back(std::make_unique<actor_backend>(sizes[p], algorithm));
      for (int k = 0; k < sizes[p]; ++k) {
        process_of.push_back(static_cast<int>(p));
        local_rank_of.push_back(k);
      }
    }
    across = std::make_unique<actor_backend>(static_cast<int>(sizes.size()), "ring");
  }
  int replicas() const { return static_cast<int>(process_of.size()); }
  std::shared_ptr<process_group> make(int r) {
    const auto p = static_cast<std::size_t>(process_of[static_cast<std::size_t>(r)]);
    const int k = local_rank_of[static_cast<std::size_t>(r)];
    hierarchical_options o;
    o.rank = r;
    o.size = replicas();
    return make_hierarchical_group(local[p]->group(k),
                                   k == 0 ? across->group(static_cast<int>(p)) : nullptr, o);
  }
};

}  // namespace

TEST_CASE("the hierarchical group over reducer actors: bit-identical sums over uneven processes") {
  for (auto sizes : {std::vector<int>{2, 1}, std::vector<int>{2, 2, 3}}) {
    for (const char* algorithm : {"ring", "tree", "reduce_to_one"}) {
      CAPTURE(algorithm);
      CAPTURE(sizes.size());
      actor_processes job(sizes, algorithm);
      const int n = job.replicas();
      std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
      auto errors = on_ranks(n, [&](int r) {
        auto g = job.make(r);
        for (int round = 0; round < 3; ++round) {  // back to back
          auto a = values(r + round, 300), b = values(r, 37);
          g->issue_all_reduce(b.data(), b.size(), reduce_op::sum);
          g->issue_all_reduce(a.data(), a.size(), reduce_op::mean);
          g->complete();
          CHECK(b == sum_of(n, 37));
          got[static_cast<std::size_t>(r)] = a;
        }
      });
      for (const auto& e : errors) CHECK(e == "");
      for (int r = 1; r < n; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);
    }
  }
}

TEST_CASE("the hierarchical group: a failure in one process fails every replica of every process") {
  SUBCASE("sizes that differ within process 0") {
    actor_processes job({2, 2}, "ring");
    auto errors = on_ranks(job.replicas(), [&](int r) {
      auto g = job.make(r);
      auto a = values(r, r == 1 ? 90 : 100);
      g->all_reduce(a.data(), a.size(), reduce_op::sum);
    });
    for (int r = 0; r < job.replicas(); ++r) {
      CAPTURE(r);
      const auto& e = errors[static_cast<std::size_t>(r)];
      CHECK(e.find("hierarchical all-reduce") != std::string::npos);
      // Process 1 learns it from the status that went around.
      if (job.process_of[static_cast<std::size_t>(r)] == 1 && r == 2)
        CHECK(e.find("a replica in another process failed") != std::string::npos);
    }
  }
  SUBCASE("process 1's first replica leaves the group across processes") {
    actor_processes job({2, 2}, "ring");
    auto errors = on_ranks(job.replicas(), [&](int r) {
      auto g = job.make(r);
      if (r == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting
        g->abort("process 1 is lost");
        return;
      }
      auto a = values(r, 100);
      g->all_reduce(a.data(), a.size(), reduce_op::sum);
    });
    for (int r : {0, 1, 3}) CHECK(errors[static_cast<std::size_t>(r)] != "");
    CHECK(errors[0].find("across processes") != std::string::npos);
  }
}
