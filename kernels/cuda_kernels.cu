#include "kernels/cuda_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda_launch.hpp"
#include "kernels/elementwise.hpp"

namespace troupe::kernels::cuda {

using namespace launch_detail;

namespace {

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) y[i] = ew::relu(x[i]);
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) dx[i] = ew::relu_grad(y[i], dy[i]);
}

__global__ void tanh_forward_kernel(const float* x, float* y, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) y[i] = ew::tanh_act(x[i]);
}

__global__ void tanh_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) dx[i] = ew::tanh_grad(y[i], dy[i]);
}

__global__ void fill_kernel(float* x, float v, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) x[i] = v;
}

__global__ void broadcast_rows_kernel(const float* b, float* y, std::size_t total,
                                      std::size_t cols) {
  TROUPE_GRID_LOOP(i, total) y[i] = b[i % cols];
}

// Column sums of an activation's gradient: g = act'(y) * dy for dy[rows,
// cols] (g = dy without one), written to dx where given (dx may alias dy),
// and db[j] (+)= the sum of column j of g. Block (t, s) owns 32 adjacent
// columns (coalesced reads) and the s-th of gridDim.y runs of rows; thread
// (x, y) sums rows y, y + 32, ... of the run in two interleaved sums (two
// loads in flight), the block adds its 32 partial sums in a fixed order, and
// with several runs the last block of a column tile to finish (counted in
// arrivals[t], which it sets back to 0) adds the runs' sums in run order:
// deterministic, one launch, and enough blocks for a GPU's multiprocessors
// where a layer has few columns and many rows.
constexpr unsigned colsum_cols = 32, colsum_rows = 32;

template <activation Act>
__device__ inline float backward_at(const float* y, const float* dy, float* dx, int64_t i) {
  float g = dy[i];
  if constexpr (Act == activation::relu) g = ew::relu_grad(y[i], g);
  if constexpr (Act == activation::tanh) g = ew::tanh_grad(y[i], g);
  if (dx) dx[i] = g;
  return g;
}

template <activation Act>
__global__ void column_sums_kernel(const float* y, const float* dy, float* dx, float* db,
                                   int64_t rows, int64_t cols, bool accumulate, float* partials,
                                   unsigned* arrivals) {
  __shared__ float part[colsum_rows][colsum_cols + 1];
  __shared__ bool last;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * colsum_cols + threadIdx.x;
  const int64_t runs = gridDim.y, run = blockIdx.y;
  const int64_t end = rows * (run + 1) / runs;
  float s0 = 0.0f, s1 = 0.0f;
  if (j < cols) {
    int64_t r = rows * run / runs + threadIdx.y;
    for (; r + colsum_rows < end; r += 2 * colsum_rows) {
      s0 += backward_at<Act>(y, dy, dx, r * cols + j);
      s1 += backward_at<Act>(y, dy, dx, (r + colsum_rows) * cols + j);
    }
    if (r < end) s0 += backward_at<Act>(y, dy, dx, r * cols + j);
  }
  part[threadIdx.y][threadIdx.x] = s0 + s1;
  __syncthreads();
  float t = 0.0f;
  if (threadIdx.y == 0)
    for (unsigned k = 0; k < colsum_rows; ++k) t += part[k][threadIdx.x];
  if (runs == 1) {
    if (threadIdx.y == 0 && j < cols) db[j] = (accumulate ? db[j] : 0.0f) + t;
    return;
  }
  if (threadIdx.y == 0 && j < cols) {
    partials[run * cols + j] = t;
    __threadfence();  // the run's sums are visible before its arrival counts
  }
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0)
    last = atomicAdd(&arrivals[blockIdx.x], 1u) == static_cast<unsigned>(runs - 1);
  __syncthreads();
  if (!last) return;
  if (threadIdx.y == 0 && j < cols) {
    float total = accumulate ? db[j] : 0.0f;
    for (int64_t s = 0; s < runs; ++s) total += __ldcg(partials + s * cols + j);
    db[j] = total;
  }
  if (threadIdx.x == 0 && threadIdx.y == 0) arrivals[blockIdx.x] = 0;
}

// ---- softmax cross-entropy: one warp per row --------------------------------

constexpr unsigned ce_warps = 8;  // rows per block (256 threads)

__device__ inline bool is_nan(float v) {
  return v != v;
}

// Does candidate a (value va at index ia) replace b as the row's argmax? The
// CPU scans best = l[0] and takes l[j] only when l[j] > best: its answer is 0
// when l[0] is NaN, else the first maximum of the non-NaN values. As a choice
// between two candidates that is a total order on every candidate that can
// win, so a warp reduces it in any order to the CPU's answer. An empty
// candidate (NaN at a large index) loses to every element.
__device__ inline bool argmax_beats(float va, int ia, float vb, int ib) {
  const bool na = is_nan(va), nb = is_nan(vb);
  if (na && ia == 0) return true;
  if (nb && ib == 0) return false;
  if (na) return false;
  if (nb) return true;
  if (va != vb) return va > vb;
  return ia < ib;
}

__global__ void softmax_ce_kernel(const float* logits, const int32_t* labels, int64_t batch,
                                  int classes, float grad_scale, float* dlogits, double* loss_sum,
                                  int64_t* correct) {
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  const int first = static_cast<int>(lane);
  double loss = 0.0;            // this warp's rows (lane 0's copy counts)
  unsigned long long hits = 0;  // likewise
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * ce_warps + warp; r < batch;
       r += static_cast<int64_t>(gridDim.x) * ce_warps) {
    const std::size_t row = static_cast<std::size_t>(r) * static_cast<std::size_t>(classes);
    const float* lr = logits + row;
    const int lab = labels[r];
    const bool lab_ok = lab >= 0 && lab < classes;
    // Row max (for stability) and argmax, as the CPU picks it.
    float mx = __int_as_float(0x7fc00000);
    int arg = 0x7fffffff;
    for (int j = first; j < classes; j += 32) {
      const float v = lr[j];
      if (argmax_beats(v, j, mx, arg)) {
        mx = v;
        arg = j;
      }
    }
    for (int off = 16; off > 0; off /= 2) {
      const float ov = __shfl_xor_sync(full_warp, mx, off);
      const int oi = __shfl_xor_sync(full_warp, arg, off);
      if (argmax_beats(ov, oi, mx, arg)) {
        mx = ov;
        arg = oi;
      }
    }
    double sum = 0.0;
    for (int j = first; j < classes; j += 32) sum += static_cast<double>(ew::exp_f(lr[j] - mx));
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(full_warp, sum, off);
    const float label_logit = lab_ok ? lr[lab] : 0.0f;
    if (lane == 0) {
      loss += lab_ok ? ew::ce_row_loss(mx, sum, label_logit)
                     : __longlong_as_double(0x7ff8000000000000LL);
      if (arg == lab) ++hits;
    }
    // Every lane has read the row (label_logit included) before any writes
    // it: dlogits may alias logits.
    __syncwarp();
    if (dlogits && lab_ok) {
      float* dr = dlogits + row;
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = first; j < classes; j += 32) {
        float d = ew::ce_dlogit(lr[j], mx, inv, grad_scale);
        if (j == lab) d -= grad_scale;
        dr[j] = d;
      }
    }
    __syncwarp();
  }
  add_block_stats<ce_warps>(loss, hits, loss_sum, correct);
}

__global__ void add_kernel(float* acc, const float* x, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) acc[i] += x[i];
}

__global__ void scale_kernel(float* x, float s, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) x[i] *= s;
}

__global__ void sgd_kernel(float* w, const float* g, std::size_t n, float lr, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::sgd_update(w[i], g[i], lr, wd);
}

__global__ void momentum_kernel(float* w, float* v, const float* g, std::size_t n, float lr,
                                float mu, bool nesterov, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::momentum_update(w[i], v[i], g[i], lr, mu, nesterov, wd);
}

__global__ void adam_kernel(float* w, float* m, float* v, const float* g, std::size_t n, float lr,
                            float b1, float b2, float eps, float step_size, float inv_sqrt_bc2,
                            float wd, bool decoupled) {
  TROUPE_GRID_LOOP(i, n)
  ew::adam_update(w[i], m[i], v[i], g[i], lr, b1, b2, eps, step_size, inv_sqrt_bc2, wd, decoupled);
}

// The step's scalars come from device memory, so a captured graph replays
// every step with its own (backend.hpp: adam_step_scheduled).
// Up to this many tensors a launch (their pointers travel as the kernel's
// argument); more take several launches.
constexpr int kAdamTensors = 16;
struct adam_launch {
  float* w[kAdamTensors];
  float* m[kAdamTensors];
  float* v[kAdamTensors];
  const float* g[kAdamTensors];
  std::size_t end[kAdamTensors];  // prefix sums of the sizes
  int count;
};

__global__ void adam_scheduled_kernel(adam_launch t, const float* scalars, const int64_t* counter,
                                      float b1, float b2, float eps, float wd, bool decoupled) {
  const float* s = scalars + 3 * counter[0];
  const float lr = s[0], step_size = s[1], inv_sqrt_bc2 = s[2];
  const std::size_t total = t.end[t.count - 1];
  TROUPE_GRID_LOOP(i, total) {
    int k = 0;
    while (i >= t.end[k]) ++k;
    const std::size_t j = i - (k > 0 ? t.end[k - 1] : 0);
    ew::adam_update(t.w[k][j], t.m[k][j], t.v[k][j], t.g[k][j], lr, b1, b2, eps, step_size,
                    inv_sqrt_bc2, wd, decoupled);
  }
}

// One block a row, each set's words strided over the threads.
__global__ void gather_planned_kernel(planned_set a, planned_set b, const int64_t* plan,
                                      const int64_t* counter, int64_t rows, int64_t* ids) {
  const int64_t* row = plan + plan[counter[0] - counter[1]];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    for (const planned_set& s : {a, b}) {
      if (!s.src) continue;
      const uint32_t* from = static_cast<const uint32_t*>(s.src) + row[r] * s.words;
      uint32_t* to = static_cast<uint32_t*>(s.dst) + r * s.words;
      for (int64_t j = threadIdx.x; j < s.words; j += blockDim.x) to[j] = from[j];
    }
    if (ids && threadIdx.x == 0) ids[r] = row[r];
  }
}

__global__ void record_stats_kernel(double* loss_sum, int64_t* correct, int64_t* counter,
                                    double* loss_out, int64_t* correct_out) {
  const int64_t k = counter[0] - counter[1];
  loss_out[k] = *loss_sum;
  correct_out[k] = *correct;
  *loss_sum = 0;
  *correct = 0;
  ++counter[0];
}

__global__ void rmsprop_kernel(float* w, float* ms, const float* g, std::size_t n, float lr,
                               float rho, float eps, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::rmsprop_update(w[i], ms[i], g[i], lr, rho, eps, wd);
}

__global__ void decay_kernel(float* w, std::size_t n, float lr, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::decoupled_decay(w[i], lr, wd);
}

}  // namespace

void relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_forward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, y, n);
  check_launch("relu_forward");
}

void relu_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(y, dy, dx, n);
  check_launch("relu_backward");
}

void tanh_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  tanh_forward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, y, n);
  check_launch("tanh_forward");
}

void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  tanh_backward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(y, dy, dx, n);
  check_launch("tanh_backward");
}

void fill(float* x, float v, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, v, n);
  check_launch("fill");
}

void broadcast_rows(const float* b, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const std::size_t total = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  broadcast_rows_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(
      b, y, total, static_cast<std::size_t>(cols));
  check_launch("broadcast_rows");
}

int64_t column_sum_runs(int64_t rows, int64_t cols, const column_sum_scratch& scratch) {
  // About 128 blocks in all, each over at least 64 rows; within the scratch.
  constexpr int64_t blocks_wanted = 128, least_rows = 64, most_runs = 64;
  const int64_t tiles = (cols + colsum_cols - 1) / colsum_cols;
  if (tiles <= 0 || !scratch.partials || tiles > static_cast<int64_t>(scratch.arrival_slots))
    return 1;
  int64_t runs = std::min<int64_t>((blocks_wanted + tiles - 1) / tiles, rows / least_rows);
  runs = std::min<int64_t>(runs, most_runs);
  runs = std::min<int64_t>(runs, static_cast<int64_t>(scratch.partial_floats) / cols);
  return std::max<int64_t>(runs, 1);
}

void activation_backward_column_sums(activation act, const float* y, const float* dy, float* dx,
                                     float* db, int64_t rows, int64_t cols, bool accumulate,
                                     const column_sum_scratch& scratch, cudaStream_t stream) {
  if (cols <= 0) return;
  if (rows < 0) throw std::invalid_argument("cuda column_sums: rows " + std::to_string(rows));
  const int64_t tiles = (cols + colsum_cols - 1) / colsum_cols;
  if (tiles > 0x7fffffff)
    throw std::invalid_argument("cuda column_sums: " + std::to_string(cols) + " columns");
  const dim3 block(colsum_cols, colsum_rows);
  const dim3 grid(static_cast<unsigned>(tiles),
                  static_cast<unsigned>(column_sum_runs(rows, cols, scratch)));
  float* partials = scratch.partials;
  unsigned* arrivals = scratch.arrivals;
  if (act == activation::relu)
    column_sums_kernel<activation::relu>
        <<<grid, block, 0, stream>>>(y, dy, dx, db, rows, cols, accumulate, partials, arrivals);
  else if (act == activation::tanh)
    column_sums_kernel<activation::tanh>
        <<<grid, block, 0, stream>>>(y, dy, dx, db, rows, cols, accumulate, partials, arrivals);
  else
    column_sums_kernel<activation::none>
        <<<grid, block, 0, stream>>>(y, dy, dx, db, rows, cols, accumulate, partials, arrivals);
  check_launch("column_sums");
}

void column_sums(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
                 const column_sum_scratch& scratch, cudaStream_t stream) {
  activation_backward_column_sums(activation::none, nullptr, dy, nullptr, db, rows, cols,
                                  accumulate, scratch, stream);
}

void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                           int64_t classes, float grad_scale, float* dlogits, double* loss_sum,
                           int64_t* correct, cudaStream_t stream) {
  // The kernel's int column index steps by 32 past the last column, and
  // 0x7fffffff marks "no candidate": classes must leave room for both.
  if (batch < 0 || classes <= 0 || classes > 0x7fffffff - 32)
    throw std::invalid_argument("cuda softmax_cross_entropy: batch " + std::to_string(batch) +
                                ", classes " + std::to_string(classes));
  if (batch == 0) return;
  const std::size_t blocks = (static_cast<std::size_t>(batch) + ce_warps - 1) / ce_warps;
  softmax_ce_kernel<<<static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks),
                      ce_warps * 32, 0, stream>>>(logits, labels, batch, static_cast<int>(classes),
                                                  grad_scale, dlogits, loss_sum, correct);
  check_launch("softmax_cross_entropy");
}

void add_inplace(float* acc, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(acc, x, n);
  check_launch("add_inplace");
}

void scale_inplace(float* x, float s, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, s, n);
  check_launch("scale_inplace");
}

void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay,
              cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, g, n, lr, weight_decay);
  check_launch("sgd_step");
}

void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                   bool nesterov, float weight_decay, cudaStream_t stream) {
  if (n == 0) return;
  momentum_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, v, g, n, lr, mu, nesterov,
                                                                   weight_decay);
  check_launch("momentum_step");
}

void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
               float b2, float eps, int64_t step, float weight_decay, bool decoupled,
               cudaStream_t stream) {
  if (step < 1)
    throw std::invalid_argument("cuda adam_step: step must be >= 1 (1-based), got " +
                                std::to_string(step));
  if (n == 0) return;
  const auto k = ew::adam_scalars_for(lr, b1, b2, step);
  adam_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(
      w, m, v, g, n, lr, b1, b2, eps, k.step_size, k.inv_sqrt_bc2, weight_decay, decoupled);
  check_launch("adam_step");
}

void adam_step_scheduled(const adam_tensors& t, const float* scalars, const int64_t* counter,
                         float b1, float b2, float eps, float weight_decay, bool decoupled,
                         cudaStream_t stream) {
  std::size_t i = 0;
  while (i < t.w.size()) {
    adam_launch a{};
    std::size_t total = 0;
    for (; i < t.w.size() && a.count < kAdamTensors; ++i) {
      if (t.n[i] == 0) continue;
      a.w[a.count] = t.w[i];
      a.m[a.count] = t.m[i];
      a.v[a.count] = t.v[i];
      a.g[a.count] = t.g[i];
      a.end[a.count++] = total += t.n[i];
    }
    if (a.count == 0) continue;
    adam_scheduled_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(
        a, scalars, counter, b1, b2, eps, weight_decay, decoupled);
    check_launch("adam_step_scheduled");
  }
}

void gather_planned_rows(planned_set a, planned_set b, const int64_t* plan, const int64_t* counter,
                         int64_t rows, int64_t* ids, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t words = std::max(a.src ? a.words : 0, b.src ? b.words : 0);
  const unsigned threads = words >= 256 ? 256 : 32;
  const auto blocks = static_cast<unsigned>(rows < 65535 ? rows : 65535);
  gather_planned_kernel<<<blocks, threads, 0, stream>>>(a, b, plan, counter, rows, ids);
  check_launch("gather_planned_rows");
}

void record_step_stats(double* loss_sum, int64_t* correct, int64_t* counter, double* loss_out,
                       int64_t* correct_out, cudaStream_t stream) {
  record_stats_kernel<<<1, 1, 0, stream>>>(loss_sum, correct, counter, loss_out, correct_out);
  check_launch("advance_step");
}

void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                  float eps, float weight_decay, cudaStream_t stream) {
  if (n == 0) return;
  rmsprop_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, ms, g, n, lr, rho, eps,
                                                                  weight_decay);
  check_launch("rmsprop_step");
}

void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay,
                          cudaStream_t stream) {
  if (n == 0) return;
  decay_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, n, lr, weight_decay);
  check_launch("decoupled_decay_step");
}

}  // namespace troupe::kernels::cuda
