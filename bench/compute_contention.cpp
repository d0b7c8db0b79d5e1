// Is compute slower when two device threads run in one process? Runs the
// MLP's forward/backward (+ Adam) on T threads at once, each with its own
// model, and prints per-thread ms per step against one thread alone. No
// actors: this isolates BLAS/allocator/cache effects from the runtime.
//
//   bench_compute_contention [threads=2] [batch=128] [steps=300]
//
// Then (threads > 1) the same threads as one ZeRO-1 group against one
// thread on the whole batch, and where the group's update goes: the
// reduce-scatter and all-gather (the gradients' and variables' chunks moved
// between the cores) against the optimizer on each thread's chunks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "bench/compute_threads.hpp"
#include "kernels/cpu_kernels.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  int64_t batch = argc > 2 ? std::atoll(argv[2]) : 128;
  int steps = argc > 3 ? std::atoi(argv[3]) : 300;
  kernels::init_cpu_kernels();
  for (bool update : {false, true}) {
    double solo = bench::run_threads(1, batch, steps, update);
    double many = bench::run_threads(threads, batch, steps, update);
    std::printf(
        "{\"bench\":\"compute_contention\",\"batch\":%lld,\"update\":%s,\"threads\":%d,"
        "\"solo_ms\":%.3f,\"concurrent_ms\":%.3f,\"slowdown\":%.3f}\n",
        static_cast<long long>(batch), update ? "true" : "false", threads, solo, many, many / solo);
  }
  // The same side by side as one data-parallel group (ZeRO-1 on the host
  // collectives), against one thread on the group's whole batch.
  if (threads > 1) {
    double whole = bench::run_threads(1, batch * threads, steps, true);
    double group = bench::run_threads(threads, batch, steps, true, true);
    std::printf(
        "{\"bench\":\"compute_contention\",\"batch\":%lld,\"update\":\"zero1\",\"threads\":%d,"
        "\"solo_global_batch_ms\":%.3f,\"group_ms\":%.3f,\"speedup\":%.3f}\n",
        static_cast<long long>(batch), threads, whole, group, whole / group);
    // Where the group's update goes: the cores' exchange against Adam.
    auto p = bench::zero1_update_phases(threads, batch, steps);
    std::printf(
        "{\"bench\":\"compute_contention\",\"batch\":%lld,\"update\":\"zero1_phases\","
        "\"threads\":%d,\"reduce_scatter_us\":%.1f,\"optimizer_us\":%.1f,"
        "\"all_gather_us\":%.1f}\n",
        static_cast<long long>(batch), threads, p.reduce_scatter_us, p.update_us, p.all_gather_us);
  }
  return 0;
}
