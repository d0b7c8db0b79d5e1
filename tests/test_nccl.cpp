// NCCL device collectives (collectives/nccl_group.cpp) on every visible
// GPU, one rank per GPU, each on a thread of its own (with one GPU, a
// 1-rank group). Without a GPU it prints why and exits 77, which ctest
// counts as skipped (label gpu).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
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

int gpus() {
  return cuda_device_count();
}
device_spec cuda(int i) {
  return device_spec{device_spec::kind_t::cuda, i};
}

// Small integers, so that sums are exact in any order.
float value(int rank, std::size_t i) {
  return static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 13) % 64) - 32.0f;
}

std::vector<float> run_collective(group_rendezvous& group, int r, std::size_t count,
                                  const std::function<void(process_group&, float*)>& op,
                                  const std::function<bool(std::size_t)>& fill = {}) {
  auto ctx = make_device_context(cuda(r));
  auto comm = group.join(r, *ctx);
  std::vector<float> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = !fill || fill(i) ? value(r, i) : std::nanf("");
  auto buf = ctx->allocate(count * sizeof(float));
  ctx->copy_to_device(buf.data(), host.data(), count * sizeof(float));
  op(*comm, buf.f32());
  ctx->synchronize();
  comm->check();
  ctx->copy_to_host(host.data(), buf.data(), count * sizeof(float));
  comm.reset();  // before its context
  return host;
}

}  // namespace

TEST_CASE("nccl all_reduce: sum and mean on every visible GPU") {
  const int n = gpus();
  const std::size_t count = (1 << 20) + 3;
  for (auto op : {reduce_op::sum, reduce_op::mean}) {
    CAPTURE(static_cast<int>(op));
    auto group = make_device_rendezvous(n, cuda(0));
    std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
    auto errors = on_ranks(n, [&](int r) {
      got[static_cast<std::size_t>(r)] = run_collective(
          *group, r, count, [&](process_group& c, float* d) { c.all_reduce(d, count, op); });
    });
    for (int r = 0; r < n; ++r) {
      REQUIRE(errors[static_cast<std::size_t>(r)] == "");
      const auto& g = got[static_cast<std::size_t>(r)];
      int bad = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float sum = 0, magnitude = 0;
        for (int q = 0; q < n; ++q) {
          sum += value(q, i);
          magnitude += std::fabs(value(q, i));
        }
        float want = op == reduce_op::mean ? sum / static_cast<float>(n) : sum;
        // Any summation order (and ncclAvg's per-term x * (1/n)) rounds
        // within a few ulps of the sum of magnitudes.
        if (std::fabs(g[i] - want) > 1e-6f * std::max(1.0f, magnitude)) ++bad;
      }
      CHECK(bad == 0);
      // NCCL's ring and tree give every rank the same bits (not promised).
      WARN(std::memcmp(g.data(), got[0].data(), count * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("nccl reduce_scatter and all_gather, in place") {
  const int n = gpus();
  const std::size_t chunk = 4099;
  const std::size_t count = chunk * static_cast<std::size_t>(n);
  auto rs = make_device_rendezvous(n, cuda(0));
  std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
  auto errors = on_ranks(n, [&](int r) {
    got[static_cast<std::size_t>(r)] = run_collective(
        *rs, r, count,
        [&](process_group& c, float* d) { c.reduce_scatter(d, chunk, reduce_op::sum); });
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE(errors[static_cast<std::size_t>(r)] == "");
    int bad = 0;
    for (std::size_t i = static_cast<std::size_t>(r) * chunk; i < (r + 1) * chunk; ++i) {
      float sum = 0;
      for (int q = 0; q < n; ++q) sum += value(q, i);
      if (got[static_cast<std::size_t>(r)][i] != sum) ++bad;
    }
    CHECK(bad == 0);
  }

  auto ag = make_device_rendezvous(n, cuda(0));
  errors = on_ranks(n, [&](int r) {
    got[static_cast<std::size_t>(r)] = run_collective(
        *ag, r, count, [&](process_group& c, float* d) { c.all_gather(d, chunk); },
        [&](std::size_t i) { return i / chunk == static_cast<std::size_t>(r); });
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE(errors[static_cast<std::size_t>(r)] == "");
    int bad = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (got[static_cast<std::size_t>(r)][i] != value(static_cast<int>(i / chunk), i)) ++bad;
    CHECK(bad == 0);
  }
}

TEST_CASE("nccl: a group rebuilt from its id in another group object is the same group") {
  const int n = gpus();
  auto chief = make_nccl_rendezvous(n);
  auto other = make_nccl_rendezvous(n, nccl_group_id(*chief));  // as another process would
  CHECK(nccl_group_id(*other) == nccl_group_id(*chief));
  std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
  auto errors = on_ranks(n, [&](int r) {
    got[static_cast<std::size_t>(r)] =
        run_collective(r == 0 ? *chief : *other, r, 1000,
                       [&](process_group& c, float* d) { c.all_reduce(d, 1000, reduce_op::sum); });
  });
  for (int r = 0; r < n; ++r) {
    REQUIRE(errors[static_cast<std::size_t>(r)] == "");
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += value(q, 999);
    CHECK(got[static_cast<std::size_t>(r)][999] == sum);
  }
  auto host = make_device_rendezvous(2, device_spec{device_spec::kind_t::sim, 0});
  CHECK_THROWS_AS(nccl_group_id(*host), device_error);
}

TEST_CASE("nccl abort releases a rank waiting for a peer that never joins") {
  // The group has one rank more than there are GPUs to join it: the last
  // never comes, and rank 0 waits in ncclCommInitRankConfig until the abort.
  const int n = gpus() + 1;
  auto group = make_device_rendezvous(n, cuda(0));
  std::atomic<int> joining{0};
  auto errors = on_ranks(n, [&](int r) {
    if (r == n - 1) {
      while (joining.load() < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      group->abort("rank " + std::to_string(r) + " is gone");
      return;
    }
    auto ctx = make_device_context(cuda(r));
    ++joining;
    auto comm = group->join(r, *ctx);
  });
  for (int r = 0; r < n - 1; ++r)
    CHECK(errors[static_cast<std::size_t>(r)].find("the group was aborted: rank " +
                                                   std::to_string(n - 1) + " is gone") !=
          std::string::npos);
}

TEST_CASE("nccl abort releases a rank whose all_reduce waits for a peer") {
  const int n = gpus();
  if (n < 2) {
    troupe::test::skip_case("needs 2 GPUs (a 1-rank all_reduce waits for nobody)");
    return;
  }
  auto group = make_device_rendezvous(n, cuda(0));
  std::atomic<int> joined{0};
  auto errors = on_ranks(n, [&](int r) {
    auto ctx = make_device_context(cuda(r));
    auto comm = group->join(r, *ctx);
    ++joined;
    if (r == n - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      group->abort("replica " + std::to_string(r) + " failed");
      return;
    }
    while (joined.load() < n) std::this_thread::yield();
    auto buf = ctx->allocate(4096 * sizeof(float));
    // Either the enqueue (connection set-up) or the kernel waits for the
    // last rank; the abort ends both.
    try {
      comm->all_reduce(buf.f32(), 4096, reduce_op::sum);
      ctx->synchronize();
    } catch (const device_error&) {
    }
    comm->check();  // throws: the group was aborted
  });
  for (int r = 0; r < n - 1; ++r)
    CHECK(errors[static_cast<std::size_t>(r)].find("the group was aborted: replica " +
                                                   std::to_string(n - 1) + " failed") !=
          std::string::npos);
}

int main(int argc, char** argv) {
  return troupe::test::gpu_test_main(argc, argv);
}
