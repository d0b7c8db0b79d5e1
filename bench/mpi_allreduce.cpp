// MPI_Allreduce yardstick for `troupe bench allreduce`, which runs it under
// mpirun with as many ranks as replicas. Sizes, op, iteration rule, timing
// (slowest rank per iteration, median over iterations) and the JSON lines are
// those of bench/allreduce.cpp, so its rows compare one to one with troupe's.
//
//   mpirun -n P bench_mpi_allreduce [--sizes 8,64K,1M,16M,64M] [--iterations K]
//                                   [--op sum|mean|min|max]
//
// Self-contained on purpose (no CAF, no troupe library); the size syntax and
// the iteration rule come from bench/bench_sizes.hpp, as in allreduce.cpp.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_sizes.hpp"

namespace {

struct options {
  std::vector<int64_t> sizes{8, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  int64_t iterations = 0;  // 0: about 1 GB of payload per size, 20 to 1000
  std::string op = "mean";
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a != "--sizes" && a != "--iterations" && a != "--op")
      throw std::invalid_argument("unknown option '" + a + "'");
    if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
    std::string v = argv[++i];
    try {
      if (a == "--sizes") {
        o.sizes.clear();
        for (const auto& item : troupe::bench::split_list(v))
          o.sizes.push_back(troupe::bench::parse_size(item));
        if (o.sizes.empty()) throw std::invalid_argument("needs at least one size");
        for (int64_t b : o.sizes)
          if ((b + 3) / 4 > INT32_MAX)  // MPI counts are int
            throw std::invalid_argument("sizes must be below 8G");
      } else if (a == "--iterations") {
        std::size_t end = 0;
        o.iterations = std::stoll(v, &end);
        if (end != v.size() || o.iterations < 1) throw std::invalid_argument("must be >= 1");
      } else if (v == "sum" || v == "mean" || v == "min" || v == "max") {
        o.op = v;
      } else {
        throw std::invalid_argument("is sum, mean, min or max");
      }
    } catch (const std::exception& e) {
      std::string why = e.what();
      // std::stoll's own message is only its name.
      if (why == "stoll") why = "not a number, or out of range";
      throw std::invalid_argument(a + " '" + v + "': " + why);
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0)
      std::fprintf(stderr,
                   "bench_mpi_allreduce: %s\nusage: mpirun -n P bench_mpi_allreduce "
                   "[--sizes 8,64K,1M,16M,64M] [--iterations K] [--op sum|mean|min|max]\n",
                   e.what());
    MPI_Finalize();
    return 2;
  }
  MPI_Op op = o.op == "min" ? MPI_MIN : o.op == "max" ? MPI_MAX : MPI_SUM;
  const float scale = o.op == "mean" ? 1.0f / static_cast<float>(n) : 1.0f;

  for (int64_t bytes : o.sizes) {
    const int64_t numel = (bytes + 3) / 4;
    const int64_t real_bytes = numel * 4;
    const int64_t iters =
        o.iterations ? o.iterations : troupe::bench::default_iterations(real_bytes);
    const int64_t warmup = std::max<int64_t>(3, iters / 10);
    const int count = static_cast<int>(numel);
    // Same contents as troupe's replicas. In place with sum the values grow
    // to inf after a few dozen rounds; that costs nothing (no denormals).
    std::vector<float> buf(numel);
    for (int64_t i = 0; i < numel; ++i) buf[i] = static_cast<float>((i + rank) % 17) * 0.25f;
    std::vector<double> seconds(iters), slowest(iters);

    for (int64_t it = 0; it < warmup + iters; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, op, MPI_COMM_WORLD);
      if (scale != 1.0f)
        for (float& x : buf) x *= scale;
      auto t1 = std::chrono::steady_clock::now();
      if (it >= warmup) seconds[it - warmup] = std::chrono::duration<double>(t1 - t0).count();
    }
    MPI_Reduce(seconds.data(), slowest.data(), static_cast<int>(iters), MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);
    if (rank == 0) {
      double sec = median(slowest);
      double busbw = n > 1 ? static_cast<double>(real_bytes) / sec * 2.0 * (n - 1) / n / 1e9 : 0.0;
      std::printf(
          "{\"algorithm\":\"mpi\",\"replicas\":%d,\"bytes\":%lld,\"seconds\":%.9g,"
          "\"busbw_gbps\":%.6g}\n",
          n, static_cast<long long>(real_bytes), sec, busbw);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
