// Device collectives in host memory (collectives/host_group.cpp): the
// contract of collectives/process_group.hpp on sim:N and cpu:N devices,
// each rank on a thread of its own, data in and out through its context.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/nccl_id.hpp"
#include "collectives/process_group.hpp"
#include "devices/device_context.hpp"
#include "tests/device_fixtures.hpp"

using namespace troupe;
using troupe::test::on_ranks;

namespace {

device_spec sim(int i) {
  return device_spec{device_spec::kind_t::sim, i};
}
device_spec cpu(int i) {
  return device_spec{device_spec::kind_t::cpu, i};
}

// Values whose sums round differently in different orders.
std::vector<float> values(int rank, std::size_t n, int salt = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = std::sin(static_cast<float>(i * 7 + static_cast<std::size_t>(rank) * 131 +
                                       static_cast<std::size_t>(salt) * 17)) *
           std::pow(10.0f, static_cast<float>((i + static_cast<std::size_t>(rank)) % 7) - 3.0f);
  return v;
}

// The contract's result: the sum in rank order 0..n-1, mean = sum * (1/n).
std::vector<float> expected_reduce(int n, std::size_t count, reduce_op op, int salt = 0,
                                   std::size_t offset = 0, std::size_t len = SIZE_MAX) {
  if (len == SIZE_MAX) len = count;
  std::vector<float> acc(len, 0.0f);
  for (int r = 0; r < n; ++r) {
    auto v = values(r, count, salt);
    for (std::size_t i = 0; i < len; ++i) acc[i] = r == 0 ? v[offset + i] : acc[i] + v[offset + i];
  }
  if (op == reduce_op::mean)
    for (auto& x : acc) x *= 1.0f / static_cast<float>(n);
  return acc;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

// One rank's buffer of `count` floats on its device, filled with `host`.
struct rank_buffer {
  std::shared_ptr<device_context> ctx;
  device_buffer buf;
  std::size_t count = 0;
  rank_buffer(const device_spec& d, const std::vector<float>& host)
      : ctx(make_device_context(d)), count(host.size()) {
    buf = ctx->allocate(std::max<std::size_t>(1, count) * sizeof(float));
    if (count) ctx->copy_to_device(buf.data(), host.data(), count * sizeof(float));
  }
  std::vector<float> read() {
    std::vector<float> out(count);
    if (count) ctx->copy_to_host(out.data(), buf.data(), count * sizeof(float));
    return out;
  }
};

}  // namespace

TEST_CASE("all_reduce: sum and mean, bit-identical to rank-order summation on every rank") {
  for (int n : {2, 3, 4})
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{1000},
                              std::size_t{4099}, std::size_t{100003}})
      for (auto op : {reduce_op::sum, reduce_op::mean}) {
        CAPTURE(n);
        CAPTURE(count);
        CAPTURE(static_cast<int>(op));
        auto group = make_device_rendezvous(n, sim(0));
        CHECK(group->size() == n);
        auto want = expected_reduce(n, count, op);
        std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
        auto errors = on_ranks(n, [&](int r) {
          rank_buffer b(sim(r), values(r, count));
          auto comm = group->join(r, *b.ctx);
          REQUIRE(comm->rank() == r);
          REQUIRE(comm->size() == n);
          comm->all_reduce(b.buf.f32(), count, op);
          comm->check();
          got[static_cast<std::size_t>(r)] = b.read();
        });
        for (int r = 0; r < n; ++r) {
          CHECK(errors[static_cast<std::size_t>(r)] == "");
          const auto& g = got[static_cast<std::size_t>(r)];
          REQUIRE(g.size() == count);
          CHECK(same_bits(g.data(), want.data(), count));
        }
      }
}

TEST_CASE("all_reduce on cpu:N devices, and a 1-rank group") {
  for (int n : {1, 3}) {
    auto group = make_device_rendezvous(n, cpu(0));
    const std::size_t count = 5000;
    auto want = expected_reduce(n, count, reduce_op::mean);
    std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
    auto errors = on_ranks(n, [&](int r) {
      rank_buffer b(cpu(r), values(r, count));
      auto comm = group->join(r, *b.ctx);
      comm->all_reduce(b.buf.f32(), count, reduce_op::mean);
      got[static_cast<std::size_t>(r)] = b.read();
    });
    for (int r = 0; r < n; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      CHECK(same_bits(got[static_cast<std::size_t>(r)].data(), want.data(), count));
    }
  }
}

TEST_CASE("reduce_scatter: rank r ends with the reduction of chunk r") {
  for (int n : {2, 3, 4})
    for (std::size_t chunk : {std::size_t{1}, std::size_t{33}, std::size_t{5000}})
      for (auto op : {reduce_op::sum, reduce_op::mean}) {
        CAPTURE(n);
        CAPTURE(chunk);
        const std::size_t count = chunk * static_cast<std::size_t>(n);
        auto group = make_device_rendezvous(n, sim(0));
        std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
        auto errors = on_ranks(n, [&](int r) {
          rank_buffer b(sim(r), values(r, count));
          auto comm = group->join(r, *b.ctx);
          comm->reduce_scatter(b.buf.f32(), chunk, op);
          got[static_cast<std::size_t>(r)] = b.read();
        });
        for (int r = 0; r < n; ++r) {
          CHECK(errors[static_cast<std::size_t>(r)] == "");
          auto off = static_cast<std::size_t>(r) * chunk;
          auto want = expected_reduce(n, count, op, 0, off, chunk);
          CHECK(same_bits(got[static_cast<std::size_t>(r)].data() + off, want.data(), chunk));
        }
      }
}

TEST_CASE("all_gather: every rank ends with every rank's own chunk") {
  for (int n : {2, 3, 4})
    for (std::size_t chunk : {std::size_t{1}, std::size_t{33}, std::size_t{5000}}) {
      CAPTURE(n);
      CAPTURE(chunk);
      const std::size_t count = chunk * static_cast<std::size_t>(n);
      auto group = make_device_rendezvous(n, sim(0));
      std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
      auto errors = on_ranks(n, [&](int r) {
        // Only chunk r is this rank's; the rest is NaN, to be overwritten.
        auto host = values(r, count);
        for (std::size_t i = 0; i < count; ++i)
          if (i / chunk != static_cast<std::size_t>(r)) host[i] = std::nanf("");
        rank_buffer b(sim(r), host);
        auto comm = group->join(r, *b.ctx);
        comm->all_gather(b.buf.f32(), chunk);
        got[static_cast<std::size_t>(r)] = b.read();
      });
      std::vector<float> want(count);
      for (int q = 0; q < n; ++q) {
        auto v = values(q, count);
        auto off = static_cast<std::size_t>(q) * chunk;
        std::copy(v.begin() + static_cast<std::ptrdiff_t>(off),
                  v.begin() + static_cast<std::ptrdiff_t>(off + chunk),
                  want.begin() + static_cast<std::ptrdiff_t>(off));
      }
      for (int r = 0; r < n; ++r) {
        CHECK(errors[static_cast<std::size_t>(r)] == "");
        CHECK(same_bits(got[static_cast<std::size_t>(r)].data(), want.data(), count));
      }
    }
}

TEST_CASE("a rank with a different size fails the collective on every rank, naming both") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    auto group = make_device_rendezvous(n, sim(0));
    std::vector<std::string> second(static_cast<std::size_t>(n));
    auto errors = on_ranks(n, [&](int r) {
      const std::size_t count = r == 1 ? 101 : 100;
      rank_buffer b(sim(r), values(r, count));
      auto comm = group->join(r, *b.ctx);
      try {
        comm->all_reduce(b.buf.f32(), count, reduce_op::sum);
      } catch (const device_error& e) {
        second[static_cast<std::size_t>(r)] = e.what();
      }
      // The group is still in step: the next collective works.
      rank_buffer c(sim(r), values(r, 64));
      comm->all_reduce(c.buf.f32(), 64, reduce_op::sum);
      auto want = expected_reduce(n, 64, reduce_op::sum);
      auto got = c.read();
      if (!same_bits(got.data(), want.data(), 64)) throw std::runtime_error("wrong result after");
    });
    for (int r = 0; r < n; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      const auto& m = second[static_cast<std::size_t>(r)];
      CHECK(m.find("all_reduce: ") == 0);
      CHECK(m.find("rank 0 called all_reduce (sum) of 100 floats") != std::string::npos);
      CHECK(m.find("rank 1 called all_reduce (sum) of 101 floats") != std::string::npos);
    }
  }
  // A different collective or op is named too.
  auto group = make_device_rendezvous(2, sim(0));
  auto errors = on_ranks(2, [&](int r) {
    rank_buffer b(sim(r), values(r, 8));
    auto comm = group->join(r, *b.ctx);
    if (r == 0)
      comm->all_reduce(b.buf.f32(), 8, reduce_op::mean);
    else
      comm->all_gather(b.buf.f32(), 4);
  });
  for (const auto& e : errors) {
    CHECK(e.find("rank 0 called all_reduce (mean) of 8 floats") != std::string::npos);
    CHECK(e.find("rank 1 called all_gather in chunks of 4 floats") != std::string::npos);
  }
}

TEST_CASE("abort from another thread releases ranks blocked in all_reduce, and ends the group") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    auto group = make_device_rendezvous(n, sim(0));
    std::atomic<int> waiting{0};
    // Every rank but the last calls all_reduce; the last never comes.
    auto errors = on_ranks(n, [&](int r) {
      rank_buffer b(sim(r), values(r, 256));
      auto comm = group->join(r, *b.ctx);
      if (r == n - 1) {
        while (waiting.load() < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        group->abort("replica " + std::to_string(r) + " failed");
        return;
      }
      ++waiting;
      comm->all_reduce(b.buf.f32(), 256, reduce_op::mean);
    });
    const std::string want =
        "all_reduce: the group was aborted: replica " + std::to_string(n - 1) + " failed";
    for (int r = 0; r < n - 1; ++r) CHECK(errors[static_cast<std::size_t>(r)] == want);
    CHECK(errors[static_cast<std::size_t>(n - 1)] == "");
  }

  // Later collectives, check() and join() throw too; a communicator's
  // abort() aborts its group; the first reason stays.
  auto group = make_device_rendezvous(2, sim(0));
  auto ctx = make_device_context(sim(0));
  auto comm = group->join(0, *ctx);
  CHECK_NOTHROW(comm->check());
  comm->abort("first");
  group->abort("second");
  auto b = ctx->allocate(64);
  CHECK_THROWS_WITH_AS(comm->all_reduce(b.f32(), 4, reduce_op::sum),
                       "all_reduce: the group was aborted: first", device_error);
  CHECK_THROWS_WITH_AS(comm->reduce_scatter(b.f32(), 2, reduce_op::sum),
                       "reduce_scatter: the group was aborted: first", device_error);
  CHECK_THROWS_WITH_AS(comm->all_gather(b.f32(), 2), "all_gather: the group was aborted: first",
                       device_error);
  CHECK_THROWS_WITH_AS(comm->check(), doctest::Contains("the group was aborted: first"),
                       device_error);
  auto ctx1 = make_device_context(sim(1));
  CHECK_THROWS_WITH_AS(group->join(1, *ctx1), doctest::Contains("rank 1 cannot join"),
                       device_error);
}

TEST_CASE("many consecutive collectives stay correct") {
  const int n = 3;
  const int rounds = 200;
  auto group = make_device_rendezvous(n, sim(0));
  std::atomic<int> wrong{0};
  auto errors = on_ranks(n, [&](int r) {
    auto ctx = make_device_context(sim(r));
    auto comm = group->join(r, *ctx);
    for (int i = 0; i < rounds; ++i) {
      // Sizes and collectives vary, so a rank that ran ahead into the next
      // collective would be caught comparing its post with a stale one.
      const std::size_t chunk = 1 + static_cast<std::size_t>(i % 7) * 100;
      const std::size_t count = chunk * n;
      auto host = values(r, count, i);
      auto b = ctx->allocate(count * sizeof(float));
      ctx->copy_to_device(b.data(), host.data(), count * sizeof(float));
      std::vector<float> got(count);
      std::size_t off = 0, len = count;
      std::vector<float> want;
      switch (i % 3) {
        case 0:
          comm->all_reduce(b.f32(), count, i % 2 ? reduce_op::mean : reduce_op::sum);
          want = expected_reduce(n, count, i % 2 ? reduce_op::mean : reduce_op::sum, i);
          break;
        case 1:
          comm->reduce_scatter(b.f32(), chunk, reduce_op::sum);
          off = static_cast<std::size_t>(r) * chunk;
          len = chunk;
          want = expected_reduce(n, count, reduce_op::sum, i, off, chunk);
          break;
        default:
          comm->all_gather(b.f32(), chunk);
          for (int q = 0; q < n; ++q) {
            auto v = values(q, count, i);
            want.insert(want.end(), v.begin() + static_cast<std::ptrdiff_t>(q * chunk),
                        v.begin() + static_cast<std::ptrdiff_t>((q + 1) * chunk));
          }
          break;
      }
      ctx->copy_to_host(got.data(), b.data(), count * sizeof(float));
      if (!same_bits(got.data() + off, want.data(), len)) ++wrong;
    }
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK(wrong == 0);
}

// Issued collectives (issue_*, then complete()): what a mirrored step does
// with a layer's gradients during backward.
TEST_CASE("issued collectives: after complete() the results of the plain calls, at any pace") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    auto group = make_device_rendezvous(n, cpu(0));
    const std::size_t ar = 1000, rs = 333, ag = 50, small = 17;
    std::atomic<int> wrong{0};
    auto errors = on_ranks(n, [&](int r) {
      rank_buffer a(cpu(r), values(r, ar, 1)), b(cpu(r), values(r, rs * n, 2)),
          c(cpu(r), values(r, ag * n, 3)), d(cpu(r), values(r, small, 4));
      auto comm = group->join(r, *a.ctx);
      for (int round = 0; round < 20; ++round) {
        // Ranks come at different paces: each in turn lags behind the others
        // between its issues, so every rank is sometimes first and sometimes
        // last to issue, and some shares wait for complete().
        auto lag = [&](int at) {
          if ((round + at) % n == r) std::this_thread::sleep_for(std::chrono::microseconds(300));
        };
        comm->issue_all_reduce(a.buf.f32(), ar, reduce_op::sum);
        lag(0);
        comm->issue_reduce_scatter(b.buf.f32(), rs, reduce_op::sum);
        lag(1);
        comm->issue_all_gather(c.buf.f32(), ag);
        comm->issue_all_reduce(d.buf.f32(), small, reduce_op::mean);
        lag(2);
        comm->complete();
        auto want_a = expected_reduce(n, ar, reduce_op::sum, 1);
        auto want_b = expected_reduce(n, rs * n, reduce_op::sum, 2, r * rs, rs);
        auto want_d = expected_reduce(n, small, reduce_op::mean, 4);
        std::vector<float> want_c;
        for (int q = 0; q < n; ++q) {
          auto v = values(q, ag * n, 3);
          want_c.insert(want_c.end(), v.begin() + q * static_cast<std::ptrdiff_t>(ag),
                        v.begin() + (q + 1) * static_cast<std::ptrdiff_t>(ag));
        }
        auto got_b = b.read();
        if (!same_bits(a.read().data(), want_a.data(), ar) ||
            !same_bits(got_b.data() + r * rs, want_b.data(), rs) ||
            !same_bits(c.read().data(), want_c.data(), ag * n) ||
            !same_bits(d.read().data(), want_d.data(), small))
          ++wrong;
        // Fresh inputs for the next round.
        for (auto* x : {&a, &b, &c, &d}) {
          auto v = values(r, x->count, x == &a ? 1 : x == &b ? 2 : x == &c ? 3 : 4);
          x->ctx->copy_to_device(x->buf.data(), v.data(), x->count * sizeof(float));
        }
      }
    });
    for (const auto& e : errors) CHECK(e == "");
    CHECK(wrong == 0);
  }
}

TEST_CASE("issued collectives: more than a window's worth before complete()") {
  // The group keeps 1024 posts per rank: a rank that runs further ahead
  // waits for its peers there, and every result is still right.
  const int n = 2;
  const std::size_t count = 3000;
  auto group = make_device_rendezvous(n, sim(0));
  std::vector<std::vector<float>> got(n);
  auto errors = on_ranks(n, [&](int r) {
    rank_buffer b(sim(r), values(r, count * 4));
    auto comm = group->join(r, *b.ctx);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (std::size_t i = 0; i < count; ++i)
      comm->issue_all_reduce(b.buf.f32() + 4 * i, 4, reduce_op::sum);
    comm->complete();
    got[static_cast<std::size_t>(r)] = b.read();
  });
  auto want = expected_reduce(n, count * 4, reduce_op::sum);
  for (int r = 0; r < n; ++r) {
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    CHECK(same_bits(got[static_cast<std::size_t>(r)].data(), want.data(), count * 4));
  }
}

TEST_CASE("issued collectives: a mismatch throws at complete() on every rank, in step after") {
  const int n = 2;
  auto group = make_device_rendezvous(n, sim(0));
  std::vector<std::string> second(n);
  std::atomic<int> wrong{0};
  auto errors = on_ranks(n, [&](int r) {
    rank_buffer a(sim(r), values(r, 64)), b(sim(r), values(r, 101)), c(sim(r), values(r, 64, 1));
    auto comm = group->join(r, *a.ctx);
    comm->issue_all_reduce(a.buf.f32(), 64, reduce_op::sum);
    comm->issue_all_reduce(b.buf.f32(), r == 1 ? 101 : 100, reduce_op::sum);
    comm->issue_all_reduce(c.buf.f32(), 64, reduce_op::sum);
    try {
      comm->complete();
    } catch (const device_error& e) {
      second[static_cast<std::size_t>(r)] = e.what();
    }
    // The collectives before and after the bad one were done.
    auto want_a = expected_reduce(n, 64, reduce_op::sum);
    auto want_c = expected_reduce(n, 64, reduce_op::sum, 1);
    if (!same_bits(a.read().data(), want_a.data(), 64) ||
        !same_bits(c.read().data(), want_c.data(), 64))
      ++wrong;
    // The bad one touched no buffer.
    auto v = values(r, 101);
    if (!same_bits(b.read().data(), v.data(), 101)) ++wrong;
    rank_buffer d(sim(r), values(r, 8));
    comm->all_reduce(d.buf.f32(), 8, reduce_op::sum);
    auto want_d = expected_reduce(n, 8, reduce_op::sum);
    if (!same_bits(d.read().data(), want_d.data(), 8)) ++wrong;
  });
  CHECK(wrong == 0);
  for (int r = 0; r < n; ++r) {
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    const auto& m = second[static_cast<std::size_t>(r)];
    CHECK(m.find("all_reduce: the ranks' calls differ: rank 0 called all_reduce (sum) of 100 "
                 "floats, rank 1 called all_reduce (sum) of 101 floats") == 0);
  }
}

TEST_CASE("issued collectives: a rank that fails after issuing leaves no peer waiting") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    auto group = make_device_rendezvous(n, sim(0));
    std::atomic<int> issued{0};
    auto errors = on_ranks(n, [&](int r) {
      rank_buffer b(sim(r), values(r, 4096 * static_cast<std::size_t>(n)));
      auto comm = group->join(r, *b.ctx);
      if (r == 0) {
        // Issues the first collective, then fails before complete(), as a
        // replica whose backward throws does (mirrored aborts the group).
        comm->issue_reduce_scatter(b.buf.f32(), 4096, reduce_op::sum);
        while (issued.load() < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        group->abort("replica 0 failed");
        return;
      }
      comm->issue_reduce_scatter(b.buf.f32(), 4096, reduce_op::sum);
      comm->issue_all_gather(b.buf.f32(), 4096);
      ++issued;
      comm->complete();
    });
    CHECK(errors[0] == "");
    // Named by the collective the rank was on: its all_gather waits for rank
    // 0's post, unless the abort came before its reduce_scatter's share.
    for (int r = 1; r < n; ++r) {
      const auto& e = errors[static_cast<std::size_t>(r)];
      CAPTURE(e);
      CHECK((e == "all_gather: the group was aborted: replica 0 failed" ||
             e == "reduce_scatter: the group was aborted: replica 0 failed"));
    }
  }
}

TEST_CASE("join: ranks outside the group, a second join, a device of another kind") {
  auto group = make_device_rendezvous(2, sim(0));
  auto ctx = make_device_context(sim(0));
  CHECK_THROWS_WITH_AS(group->join(2, *ctx),
                       "device collectives: rank 2 is outside the group of 2 ranks", device_error);
  CHECK_THROWS_AS(group->join(-1, *ctx), device_error);
  auto c0 = group->join(0, *ctx);
  CHECK_THROWS_WITH_AS(group->join(0, *ctx), "device collectives: rank 0 joined twice",
                       device_error);
  auto cpu_ctx = make_device_context(cpu(1));
  CHECK_THROWS_WITH_AS(
      group->join(1, *cpu_ctx),
      doctest::Contains("rank 1 joined with cpu:1, but this group's devices are sim:N"),
      device_error);
  CHECK_THROWS_AS(make_device_rendezvous(0, sim(0)), device_error);
}

TEST_CASE("cuda groups need NCCL") {
  if (built_with_nccl()) {
    CHECK_THROWS_AS(nccl_group_id(*make_device_rendezvous(2, sim(0))), device_error);
    return;
  }
  CHECK_THROWS_WITH_AS(make_device_rendezvous(2, device_spec{device_spec::kind_t::cuda, 0}),
                       "device collectives on cuda:0: cuda devices need NCCL: this build has none",
                       device_error);
  CHECK_THROWS_WITH_AS(make_nccl_rendezvous(2), "cuda devices need NCCL: this build has none",
                       device_error);
}

TEST_CASE("min and max are refused by name: device collectives reduce by sum or mean") {
  // A 1-rank group: the refusal comes before any barrier, so nothing waits.
  auto group = make_device_rendezvous(1, sim(0));
  auto ctx = make_device_context(sim(0));
  auto comm = group->join(0, *ctx);
  auto b = ctx->allocate(64);
  CHECK_THROWS_WITH_AS(comm->all_reduce(b.f32(), 4, reduce_op::max),
                       "device collectives: all_reduce (max): device collectives reduce by sum or "
                       "mean only; min and max need the reducer actors (ring, tree, reduce_to_one)",
                       device_error);
  CHECK_THROWS_WITH_AS(comm->reduce_scatter(b.f32(), 4, reduce_op::min),
                       doctest::Contains("reduce_scatter (min): device collectives reduce by sum"),
                       device_error);
  CHECK_NOTHROW(comm->all_reduce(b.f32(), 4, reduce_op::sum));  // the group is still usable
}
