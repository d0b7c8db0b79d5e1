#pragma once
// What the .cu files share (kernels/cuda_kernels.cu, cuda_row_layers.cu,
// cuda_conv_layers.cu): the grid sizes, the grid-stride loop, the check
// after a launch and the dimension checks before one, the block sums of the
// one-warp-per-row losses. Device code: included by nvcc-compiled files
// only, not for use outside kernels/.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace troupe::kernels::cuda::launch_detail {

inline constexpr unsigned threads_per_block = 256;
inline constexpr std::size_t max_blocks = 4096;  // grid-stride loops cover the rest
inline constexpr unsigned full_warp = 0xffffffffu;

inline unsigned blocks_for(std::size_t n) {
  std::size_t b = (n + threads_per_block - 1) / threads_per_block;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

// cudaGetLastError also returns a sticky fault of earlier asynchronous work
// (an illegal address in some kernel before), which this launch did not
// cause; unlike a launch error it is not cleared by reading it, and the
// message says so.
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return;
  const bool earlier = cudaPeekAtLastError() == e;
  throw std::runtime_error(std::string("cuda ") + what + ": " + cudaGetErrorString(e) +
                           (earlier ? " (an earlier asynchronous fault on this device, not "
                                      "necessarily this kernel)"
                                    : ""));
}

inline void check_dims(const char* op, std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d < 0) throw std::invalid_argument(std::string("cuda ") + op + ": negative dimension");
}

inline std::size_t prod(int64_t a, int64_t b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

// The one-warp-per-row losses' end: adds the block's per-warp loss and
// count (lane 0 of each of its Warps warps holds its own) in a fixed order,
// with one atomic each.
template <unsigned Warps>
__device__ inline void add_block_stats(double loss, unsigned long long hits, double* loss_sum,
                                       int64_t* correct) {
  __shared__ double warp_loss[Warps];
  __shared__ unsigned long long warp_hits[Warps];
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  if (lane == 0) {
    warp_loss[warp] = loss;
    warp_hits[warp] = hits;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double l = 0.0;
    unsigned long long h = 0;
    for (unsigned w = 0; w < Warps; ++w) {
      l += warp_loss[w];
      h += warp_hits[w];
    }
    if (loss_sum) atomicAdd(loss_sum, l);
    if (correct && h) atomicAdd(reinterpret_cast<unsigned long long*>(correct), h);
  }
}

}  // namespace troupe::kernels::cuda::launch_detail

// Grid-stride loop: each thread handles i, i + stride, ...
#define TROUPE_GRID_LOOP(i, n)                                                                   \
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)
