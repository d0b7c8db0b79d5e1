// The row-wise layers of the CUDA path (kernels/cuda_layers.hpp), over
// [rows, cols] or flat tensors: the point-wise activations, layer norm (one
// warp a row), dropout, embeddings, and the sigmoid cross-entropy and
// squared-error losses (one warp an example). Its own file because these
// share the warp-per-row launch shape and the activations' device math,
// which the NCHW layers (kernels/cuda_conv_layers.cu) do not use.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda_launch.hpp"
#include "kernels/cuda_layers.hpp"
#include "kernels/elementwise.hpp"

namespace troupe::kernels::cuda {

using namespace launch_detail;

namespace {

constexpr unsigned row_warps = 8;  // rows per block of the one-warp-per-row kernels

unsigned row_blocks(int64_t rows) {
  const std::size_t b = (static_cast<std::size_t>(rows) + row_warps - 1) / row_warps;
  return static_cast<unsigned>(b < max_blocks ? b : max_blocks);
}

// ---- element-wise math of the layer operations -------------------------------
// Kept here, not in kernels/elementwise.hpp, which the CPU side owns.

__device__ inline float sigmoid_f(float x) {
  // exp of a non-positive argument only: no overflow for large |x|.
  if (x >= 0.0f) return 1.0f / (1.0f + ::expf(-x));
  const float e = ::expf(x);
  return e / (1.0f + e);
}

__device__ inline float gelu_f(float x) {
  return 0.5f * x * (1.0f + ::erff(x * 0.70710678118654752f));
}

// d/dx x Phi(x) = Phi(x) + x phi(x).
__device__ inline float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + ::erff(x * 0.70710678118654752f));
  const float pdf = ::expf(-0.5f * x * x) * 0.39894228040143268f;
  return cdf + x * pdf;
}

__device__ inline double warp_sum(double v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(full_warp, v, off);
  return v;
}

// ---- point-wise functions ---------------------------------------------------

__global__ void unary_forward_kernel(unary_op op, float alpha, const float* x, float* y,
                                     std::size_t n) {
  TROUPE_GRID_LOOP(i, n) {
    const float v = x[i];
    float r;
    switch (op) {
      case unary_op::relu:
        r = ew::relu(v);
        break;
      case unary_op::leaky_relu:
        r = v > 0.0f ? v : alpha * v;
        break;
      case unary_op::gelu:
        r = gelu_f(v);
        break;
      case unary_op::tanh:
        r = ew::tanh_act(v);
        break;
      default:
        r = sigmoid_f(v);
        break;
    }
    y[i] = r;
  }
}

// relu and leaky_relu read x (the sign of the input), falling back to y
// where the caller kept only the output; gelu reads x; tanh and sigmoid
// read y.
__global__ void unary_backward_kernel(unary_op op, float alpha, const float* x, const float* y,
                                      const float* dy, float* dx, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) {
    const float g = dy[i];
    float r;
    switch (op) {
      case unary_op::relu:
        r = (x ? x[i] : y[i]) > 0.0f ? g : 0.0f;
        break;
      case unary_op::leaky_relu:
        r = (x ? x[i] : y[i]) > 0.0f ? g : alpha * g;
        break;
      case unary_op::gelu:
        r = g * gelu_grad(x[i]);
        break;
      case unary_op::tanh:
        r = ew::tanh_grad(y[i], g);
        break;
      default: {
        const float s = y[i];
        r = g * s * (1.0f - s);
        break;
      }
    }
    dx[i] = r;
  }
}

// ---- layer norm: one warp per row --------------------------------------------

__global__ void ln_forward_kernel(const float* x, const float* gamma, const float* beta, float* y,
                                  float* mean, float* invstd, int64_t rows, int64_t cols,
                                  float eps) {
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * row_warps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * row_warps) {
    const float* xr = x + r * cols;
    double s = 0.0;
    for (int64_t j = lane; j < cols; j += 32) s += static_cast<double>(xr[j]);
    const double m = warp_sum(s) / static_cast<double>(cols);
    double q = 0.0;
    for (int64_t j = lane; j < cols; j += 32) {
      const double d = static_cast<double>(xr[j]) - m;
      q += d * d;
    }
    const double var = warp_sum(q) / static_cast<double>(cols);
    const float mf = static_cast<float>(m);
    const float is = 1.0f / ew::sqrt_f(static_cast<float>(var) + eps);
    // Every lane has read the row before any writes it: y may alias x.
    __syncwarp();
    float* yr = y + r * cols;
    for (int64_t j = lane; j < cols; j += 32) {
      const float g = gamma ? gamma[j] : 1.0f, b = beta ? beta[j] : 0.0f;
      yr[j] = (xr[j] - mf) * is * g + b;
    }
    if (lane == 0) {
      if (mean) mean[r] = mf;
      if (invstd) invstd[r] = is;
    }
    __syncwarp();
  }
}

// dx = invstd * (g dy - mean_j(g dy) - xhat * mean_j(g dy xhat)).
__global__ void ln_backward_dx_kernel(const float* x, const float* dy, const float* gamma,
                                      const float* mean, const float* invstd, float* dx,
                                      int64_t rows, int64_t cols) {
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * row_warps + warp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * row_warps) {
    const float* xr = x + r * cols;
    const float* dr = dy + r * cols;
    const float m = mean[r], is = invstd[r];
    double a = 0.0, b = 0.0;
    for (int64_t j = lane; j < cols; j += 32) {
      const float gd = (gamma ? gamma[j] : 1.0f) * dr[j];
      a += static_cast<double>(gd);
      b += static_cast<double>(gd) * static_cast<double>((xr[j] - m) * is);
    }
    const float ma = static_cast<float>(warp_sum(a) / static_cast<double>(cols));
    const float mb = static_cast<float>(warp_sum(b) / static_cast<double>(cols));
    __syncwarp();  // dx may alias dy
    float* out = dx + r * cols;
    for (int64_t j = lane; j < cols; j += 32) {
      const float gd = (gamma ? gamma[j] : 1.0f) * dr[j];
      out[j] = is * (gd - ma - (xr[j] - m) * is * mb);
    }
    __syncwarp();
  }
}

// dgamma[j] (+)= sum_r dy * xhat, dbeta[j] (+)= sum_r dy: 32 columns per
// block (coalesced), 8 row phases added in a fixed order.
constexpr unsigned colsum_cols = 32, colsum_rows = 8;

__global__ void ln_backward_params_kernel(const float* x, const float* dy, const float* mean,
                                          const float* invstd, float* dgamma, float* dbeta,
                                          int64_t rows, int64_t cols, bool accumulate) {
  __shared__ float pg[colsum_rows][colsum_cols + 1];
  __shared__ float pb[colsum_rows][colsum_cols + 1];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * colsum_cols + threadIdx.x;
  float sg = 0.0f, sb = 0.0f;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += colsum_rows) {
      const float g = dy[r * cols + j];
      sg += g * (x[r * cols + j] - mean[r]) * invstd[r];
      sb += g;
    }
  pg[threadIdx.y][threadIdx.x] = sg;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float tg = 0.0f, tb = 0.0f;
    for (unsigned k = 0; k < colsum_rows; ++k) {
      tg += pg[k][threadIdx.x];
      tb += pb[k][threadIdx.x];
    }
    if (dgamma) dgamma[j] = accumulate ? dgamma[j] + tg : tg;
    if (dbeta) dbeta[j] = accumulate ? dbeta[j] + tb : tb;
  }
}

// ---- dropout, embedding -----------------------------------------------------

// counter non-null: the seed is the step's (dropout_at_step), read here so
// that a captured launch draws each step's masks.
__global__ void dropout_kernel(const float* x, float* y, std::size_t total, int64_t cols,
                               float rate, float scale, uint64_t seed, const int64_t* ids,
                               const int64_t* counter, uint64_t layer) {
  if (counter) seed = dropout_step_seed(seed, counter[0], layer);
  TROUPE_GRID_LOOP(i, total) {
    const int64_t r = static_cast<int64_t>(i / static_cast<std::size_t>(cols));
    const int64_t j = static_cast<int64_t>(i % static_cast<std::size_t>(cols));
    y[i] = dropout_keep(seed, ids[r], j, rate) ? x[i] * scale : 0.0f;
  }
}

__global__ void embedding_forward_kernel(const float* ids, const float* table, float* out,
                                         std::size_t total, int64_t dim) {
  TROUPE_GRID_LOOP(i, total) {
    const std::size_t t = i / static_cast<std::size_t>(dim);
    const int64_t d = static_cast<int64_t>(i % static_cast<std::size_t>(dim));
    out[i] = table[static_cast<int64_t>(ids[t]) * dim + d];
  }
}

__global__ void embedding_bag_forward_kernel(const float* ids, const float* table, float* out,
                                             std::size_t total, int64_t len, int64_t dim) {
  TROUPE_GRID_LOOP(i, total) {
    const int64_t r = static_cast<int64_t>(i / static_cast<std::size_t>(dim));
    const int64_t d = static_cast<int64_t>(i % static_cast<std::size_t>(dim));
    float s = 0.0f;
    for (int64_t l = 0; l < len; ++l) s += table[static_cast<int64_t>(ids[r * len + l]) * dim + d];
    out[i] = len > 0 ? s / static_cast<float>(len) : 0.0f;
  }
}

// i runs over rows * len * dim; with bag_mean dy is [rows, dim].
__global__ void embedding_backward_kernel(const float* ids, const float* dy, float* dtable,
                                          std::size_t total, int64_t len, int64_t vocab,
                                          int64_t dim, bool bag_mean) {
  TROUPE_GRID_LOOP(i, total) {
    const std::size_t t = i / static_cast<std::size_t>(dim);
    const int64_t d = static_cast<int64_t>(i % static_cast<std::size_t>(dim));
    const int64_t id = static_cast<int64_t>(ids[t]);
    if (id < 0 || id >= vocab) continue;  // checked by the caller; never write outside
    const float g =
        bag_mean ? dy[static_cast<int64_t>(t) / len * dim + d] / static_cast<float>(len) : dy[i];
    atomicAdd(dtable + id * dim + d, g);
  }
}

// ---- losses: one warp per example ------------------------------------------

__global__ void sigmoid_ce_kernel(const float* logits, const float* targets, int64_t batch,
                                  int64_t outputs, float grad_scale, float* dlogits,
                                  double* loss_sum, int64_t* correct) {
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  double loss = 0.0;
  unsigned long long hits = 0;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * row_warps + warp; r < batch;
       r += static_cast<int64_t>(gridDim.x) * row_warps) {
    const int64_t base = r * outputs;
    double l = 0.0;
    bool right = true;
    for (int64_t j = lane; j < outputs; j += 32) {
      const float z = logits[base + j], t = targets[base + j];
      const double zd = z, td = t;
      l += (zd > 0.0 ? zd : 0.0) - zd * td + ::log1p(::exp(-(zd < 0.0 ? -zd : zd)));
      right = right && ((z > 0.0f) == (t > 0.5f));
      if (dlogits) dlogits[base + j] = (sigmoid_f(z) - t) * grad_scale;
    }
    l = warp_sum(l);
    const bool all_right = __all_sync(full_warp, right);
    if (lane == 0) {
      loss += l;
      if (all_right) ++hits;
    }
  }
  add_block_stats<row_warps>(loss, hits, loss_sum, correct);
}

__global__ void mse_kernel(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                           float grad_scale, float* dpred, double* loss_sum) {
  const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
  double loss = 0.0;
  const float inv_outputs = 1.0f / static_cast<float>(outputs);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * row_warps + warp; r < batch;
       r += static_cast<int64_t>(gridDim.x) * row_warps) {
    const int64_t base = r * outputs;
    double l = 0.0;
    for (int64_t j = lane; j < outputs; j += 32) {
      const float d = pred[base + j] - targets[base + j];
      l += static_cast<double>(d) * static_cast<double>(d);
      if (dpred) dpred[base + j] = 2.0f * d * inv_outputs * grad_scale;
    }
    l = warp_sum(l);
    if (lane == 0) loss += l / static_cast<double>(outputs);
  }
  add_block_stats<row_warps>(loss, 0, loss_sum, nullptr);
}

}  // namespace

void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  unary_forward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(op, alpha, x, y, n);
  check_launch("unary_forward");
}

void unary_backward(unary_op op, float alpha, const float* x, const float* y, const float* dy,
                    float* dx, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool needs_x = op == unary_op::gelu;
  const bool needs_y = op == unary_op::tanh || op == unary_op::sigmoid;
  if ((needs_x && !x) || (needs_y && !y) || (!x && !y))
    throw std::invalid_argument("cuda unary_backward: the forward's input or output is null");
  unary_backward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(op, alpha, x, y, dy, dx,
                                                                         n);
  check_launch("unary_backward");
}

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* invstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
  check_dims("layer_norm_forward", {rows, cols});
  if (rows == 0 || cols == 0) return;
  ln_forward_kernel<<<row_blocks(rows), row_warps * 32, 0, stream>>>(x, gamma, beta, y, mean,
                                                                     invstd, rows, cols, eps);
  check_launch("layer_norm_forward");
}

void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                         const float* invstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                         int64_t cols, bool accumulate, cudaStream_t stream) {
  check_dims("layer_norm_backward", {rows, cols});
  if (cols == 0) return;
  // The parameter sums read dy before dx (which may alias it) is written.
  if (dgamma || dbeta) {
    const int64_t tiles = (cols + colsum_cols - 1) / colsum_cols;
    if (tiles > 0x7fffffff)
      throw std::invalid_argument("cuda layer_norm_backward: too many columns");
    ln_backward_params_kernel<<<static_cast<unsigned>(tiles), dim3(colsum_cols, colsum_rows), 0,
                                stream>>>(x, dy, mean, invstd, dgamma, dbeta, rows, cols,
                                          accumulate);
    check_launch("layer_norm_backward (parameters)");
  }
  if (dx && rows > 0) {
    ln_backward_dx_kernel<<<row_blocks(rows), row_warps * 32, 0, stream>>>(x, dy, gamma, mean,
                                                                           invstd, dx, rows, cols);
    check_launch("layer_norm_backward");
  }
}

void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
             const int64_t* ids, cudaStream_t stream, const int64_t* counter, uint64_t layer) {
  check_dims("dropout", {rows, cols});
  if (!(rate >= 0.0f && rate < 1.0f))
    throw std::invalid_argument("cuda dropout: rate " + std::to_string(rate) + " outside [0, 1)");
  const std::size_t total = prod(rows, cols);
  if (total == 0) return;
  dropout_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(
      x, y, total, cols, rate, 1.0f / (1.0f - rate), seed, ids, counter, layer);
  check_launch("dropout");
}

void embedding_forward(const float* ids, const float* table, float* out, int64_t rows, int64_t len,
                       int64_t dim, bool bag_mean, cudaStream_t stream) {
  check_dims("embedding_forward", {rows, len, dim});
  if (bag_mean) {
    const std::size_t total = prod(rows, dim);
    if (total == 0) return;
    embedding_bag_forward_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(
        ids, table, out, total, len, dim);
  } else {
    const std::size_t total = prod(rows * len, dim);
    if (total == 0) return;
    embedding_forward_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(ids, table, out,
                                                                                  total, dim);
  }
  check_launch("embedding_forward");
}

void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t len,
                        int64_t vocab, int64_t dim, bool bag_mean, bool accumulate,
                        cudaStream_t stream) {
  check_dims("embedding_backward", {rows, len, vocab, dim});
  if (!accumulate && vocab > 0 && dim > 0) {
    const cudaError_t e = cudaMemsetAsync(dtable, 0, prod(vocab, dim) * sizeof(float), stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::runtime_error(std::string("cuda embedding_backward: cudaMemsetAsync: ") +
                               cudaGetErrorString(e));
    }
  }
  const std::size_t total = prod(rows * len, dim);
  if (total == 0) return;
  embedding_backward_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(
      ids, dy, dtable, total, len, vocab, dim, bag_mean);
  check_launch("embedding_backward");
}

void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                           int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                           int64_t* correct, cudaStream_t stream) {
  check_dims("sigmoid_cross_entropy", {batch, outputs});
  if (batch == 0) return;
  sigmoid_ce_kernel<<<row_blocks(batch), row_warps * 32, 0, stream>>>(
      logits, targets, batch, outputs, grad_scale, dlogits, loss_sum, correct);
  check_launch("sigmoid_cross_entropy");
}

void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                        float grad_scale, float* dpred, double* loss_sum, cudaStream_t stream) {
  check_dims("mean_squared_error", {batch, outputs});
  if (batch == 0 || outputs == 0) return;
  mse_kernel<<<row_blocks(batch), row_warps * 32, 0, stream>>>(pred, targets, batch, outputs,
                                                               grad_scale, dpred, loss_sum);
  check_launch("mean_squared_error");
}

}  // namespace troupe::kernels::cuda
