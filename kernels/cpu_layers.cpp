// The CPU layers but convolution and pooling (kernels/cpu_layers.hpp):
// point-wise functions, batch and layer normalisation, dropout, embedding,
// losses. Convolution and pooling: kernels/cpu_conv_pool.cpp.
#include "kernels/cpu_layers.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cpu_isa.hpp"
#include "kernels/cpu_layer_detail.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/vector_kernels.hpp"

namespace troupe::kernels::cpu {
namespace {

using layer_detail::sz;
using layer_detail::zero;

// The batch-norm sums in double run at two doubles a lane in SSE2, which
// makes them compute-bound; the same loops are also built for AVX2 and
// AVX-512 and picked by active_isa() (kernels/cpu_isa.hpp), as the vector
// loops are. On 128x32x28x28, 1 thread (AMD EPYC): sums 0.62 ms at SSE2,
// 0.35 AVX2, 0.24 AVX-512; backward sums 1.7-1.9, 1.3, 0.9-1.2.
// always_inline: the body is compiled inside each target's wrapper.
__attribute__((always_inline)) inline void bn_sums(const float* x, int64_t batch, int64_t channels,
                                                   int64_t spatial, float* sums) {
  const std::size_t hw = sz(spatial);
  for (int64_t c = 0; c < channels; ++c) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < batch; ++n) {
      const float* p = x + (sz(n) * sz(channels) + sz(c)) * hw;
#pragma omp simd reduction(+ : s, q)
      for (std::size_t i = 0; i < hw; ++i) {
        const double v = p[i];
        s += v;
        q += v * v;
      }
    }
    sums[c] = static_cast<float>(s);
    sums[channels + c] = static_cast<float>(q);
  }
}
TROUPE_AVX2 void bn_sums_avx2(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                              float* sums) {
  bn_sums(x, batch, channels, spatial, sums);
}
TROUPE_AVX512 void bn_sums_avx512(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                                  float* sums) {
  bn_sums(x, batch, channels, spatial, sums);
}

__attribute__((always_inline)) inline void bn_backward_sums(const float* x, const float* dy,
                                                            const float* mean, const float* invstd,
                                                            int64_t batch, int64_t channels,
                                                            int64_t spatial, float* sums) {
  const std::size_t hw = sz(spatial);
  for (int64_t c = 0; c < channels; ++c) {
    const double m = mean[c];
    double sd = 0, sdx = 0;
    for (int64_t n = 0; n < batch; ++n) {
      const std::size_t off = (sz(n) * sz(channels) + sz(c)) * hw;
      const float* xp = x + off;
      const float* dp = dy + off;
#pragma omp simd reduction(+ : sd, sdx)
      for (std::size_t i = 0; i < hw; ++i) {
        const double d = dp[i];
        sd += d;
        sdx += d * (static_cast<double>(xp[i]) - m);
      }
    }
    sums[c] = static_cast<float>(sd);
    sums[channels + c] = static_cast<float>(sdx * static_cast<double>(invstd[c]));
  }
}
TROUPE_AVX2 void bn_backward_sums_avx2(const float* x, const float* dy, const float* mean,
                                       const float* invstd, int64_t batch, int64_t channels,
                                       int64_t spatial, float* sums) {
  bn_backward_sums(x, dy, mean, invstd, batch, channels, spatial, sums);
}
TROUPE_AVX512 void bn_backward_sums_avx512(const float* x, const float* dy, const float* mean,
                                           const float* invstd, int64_t batch, int64_t channels,
                                           int64_t spatial, float* sums) {
  bn_backward_sums(x, dy, mean, invstd, batch, channels, spatial, sums);
}

// The batch-norm forward and backward applications, per channel a*x+b and
// k*dy+u*x+v: memory-bound passes, built per level as the sums are.
__attribute__((always_inline)) inline void bn_apply(const float* x, const float* mean,
                                                    const float* invstd, const float* gamma,
                                                    const float* beta, float* y, int64_t batch,
                                                    int64_t channels, int64_t spatial) {
  const std::size_t hw = sz(spatial);
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      // y = x * a + b with the channel's scale and shift folded once.
      const float a = invstd[c] * (gamma ? gamma[c] : 1.0f);
      const float b = (beta ? beta[c] : 0.0f) - mean[c] * a;
      const std::size_t off = (sz(n) * sz(channels) + sz(c)) * hw;
      const float* xp = x + off;
      float* yp = y + off;
#pragma omp simd
      for (std::size_t i = 0; i < hw; ++i) yp[i] = xp[i] * a + b;
    }
}

__attribute__((always_inline)) inline void bn_apply_backward(const float* x, const float* dy,
                                                             const float* mean, const float* invstd,
                                                             const float* gamma, const float* sums,
                                                             double count, float* dx, int64_t batch,
                                                             int64_t channels, int64_t spatial) {
  const std::size_t hw = sz(spatial);
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      // dx = k (dy - sum_dy/count - xhat sum_dy_xhat/count), expanded to
      // dx = k dy + u x + v per channel.
      const double is = invstd[c];
      const double k = (gamma ? gamma[c] : 1.0) * is;
      const double md = static_cast<double>(sums[c]) / count;
      const double mdx = static_cast<double>(sums[channels + c]) / count;
      const float kf = static_cast<float>(k);
      const float u = static_cast<float>(-k * is * mdx);
      const float v = static_cast<float>(-k * md + k * is * mdx * mean[c]);
      const std::size_t off = (sz(n) * sz(channels) + sz(c)) * hw;
      const float* xp = x + off;
      const float* dp = dy + off;
      float* out = dx + off;
#pragma omp simd
      for (std::size_t i = 0; i < hw; ++i) out[i] = kf * dp[i] + u * xp[i] + v;
    }
}

// g++ contracts a * x + b into an FMA where the target has one, even in ISO
// C++ mode: these wrappers keep the baseline's rounding at every level, as
// the loops of kernels/vector_kernels.inc do (-ffp-contract=off there).
#define TROUPE_NO_CONTRACTION __attribute__((optimize("fp-contract=off")))
#define TROUPE_BN_WRAPPERS(suffix, attr)                                                           \
  attr TROUPE_NO_CONTRACTION void bn_apply_##suffix(                                               \
      const float* x, const float* mean, const float* invstd, const float* gamma,                  \
      const float* beta, float* y, int64_t batch, int64_t channels, int64_t spatial) {             \
    bn_apply(x, mean, invstd, gamma, beta, y, batch, channels, spatial);                           \
  }                                                                                                \
  attr TROUPE_NO_CONTRACTION void bn_apply_backward_##suffix(                                      \
      const float* x, const float* dy, const float* mean, const float* invstd, const float* gamma, \
      const float* sums, double count, float* dx, int64_t batch, int64_t channels,                 \
      int64_t spatial) {                                                                           \
    bn_apply_backward(x, dy, mean, invstd, gamma, sums, count, dx, batch, channels, spatial);      \
  }
TROUPE_BN_WRAPPERS(baseline, )
TROUPE_BN_WRAPPERS(avx2, TROUPE_AVX2)
TROUPE_BN_WRAPPERS(avx512, TROUPE_AVX512)
#undef TROUPE_BN_WRAPPERS

// The dropout hash is two 64-bit mixes per element: scalar below AVX-512
// (no 64-bit vector multiply; AVX2 measured no faster), vectorised with
// AVX-512DQ: 128x3136 (the convnet's dropout) 0.12 ms against 2.0.
__attribute__((always_inline)) inline void dropout_rows(const float* x, float* y, int64_t rows,
                                                        int64_t cols, float rate, uint64_t seed,
                                                        const int64_t* ids) {
  const float scale = 1.0f / (1.0f - rate);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + sz(r) * sz(cols);
    float* yr = y + sz(r) * sz(cols);
    const int64_t id = ids[r];
    for (int64_t j = 0; j < cols; ++j)
      yr[j] = dropout_keep(seed, id, j, rate) ? xr[j] * scale : 0.0f;
  }
}
TROUPE_AVX512 void dropout_avx512(const float* x, float* y, int64_t rows, int64_t cols, float rate,
                                  uint64_t seed, const int64_t* ids) {
  dropout_rows(x, y, rows, cols, rate, seed, ids);
}

}  // namespace

// ---- point-wise functions ---------------------------------------------------

void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n) {
  switch (op) {
    case unary_op::relu:
      active_vector_kernels().relu_forward(x, y, n);
      break;
    case unary_op::leaky_relu:
      for (std::size_t i = 0; i < n; ++i) y[i] = ew::leaky_relu(x[i], alpha);
      break;
    case unary_op::gelu:
      for (std::size_t i = 0; i < n; ++i) y[i] = ew::gelu(x[i]);
      break;
    case unary_op::tanh:
      for (std::size_t i = 0; i < n; ++i) y[i] = ew::tanh_act(x[i]);
      break;
    case unary_op::sigmoid:
      for (std::size_t i = 0; i < n; ++i) y[i] = ew::sigmoid(x[i]);
      break;
  }
}

void unary_backward(unary_op op, float alpha, const float* x, const float* y, const float* dy,
                    float* dx, std::size_t n) {
  const bool needs_x = op == unary_op::gelu;
  const bool needs_y = op == unary_op::tanh || op == unary_op::sigmoid;
  if ((needs_x && !x) || (needs_y && !y) || (!x && !y))
    throw std::invalid_argument("unary_backward: the forward's input or output is null");
  const float* sign = x ? x : y;
  switch (op) {
    case unary_op::relu:
      // relu and leaky_relu read the input's sign, or the output's where
      // only it was kept (as the CUDA side does).
      active_vector_kernels().relu_backward(sign, dy, dx, n);
      break;
    case unary_op::leaky_relu:
      for (std::size_t i = 0; i < n; ++i) dx[i] = ew::leaky_relu_grad(sign[i], alpha, dy[i]);
      break;
    case unary_op::gelu:
      for (std::size_t i = 0; i < n; ++i) dx[i] = ew::gelu_grad(x[i], dy[i]);
      break;
    case unary_op::tanh:
      for (std::size_t i = 0; i < n; ++i) dx[i] = ew::tanh_grad(y[i], dy[i]);
      break;
    case unary_op::sigmoid:
      for (std::size_t i = 0; i < n; ++i) dx[i] = ew::sigmoid_grad(y[i], dy[i]);
      break;
  }
}

// ---- batch normalisation ------------------------------------------------------

void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                     float* sums) {
  switch (active_isa()) {
    case cpu_isa::avx512:
      return bn_sums_avx512(x, batch, channels, spatial, sums);
    case cpu_isa::avx2:
      return bn_sums_avx2(x, batch, channels, spatial, sums);
    case cpu_isa::baseline:
      break;
  }
  bn_sums(x, batch, channels, spatial, sums);
}

void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                           float momentum, float* mean, float* invstd, float* running_mean,
                           float* running_var) {
  for (int64_t c = 0; c < channels; ++c) {
    const double m = static_cast<double>(sums[c]) / count;
    double var = static_cast<double>(sums[channels + c]) / count - m * m;
    if (var < 0) var = 0;  // rounding of E[x^2] - E[x]^2
    mean[c] = static_cast<float>(m);
    invstd[c] = static_cast<float>(1.0 / ::sqrt(var + static_cast<double>(eps)));
    const double mo = momentum;
    if (running_mean) running_mean[c] = static_cast<float>((1 - mo) * running_mean[c] + mo * m);
    if (running_var) {
      const double unbiased = count > 1 ? var * count / (count - 1) : var;
      running_var[c] = static_cast<float>((1 - mo) * running_var[c] + mo * unbiased);
    }
  }
}

void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) invstd[i] = 1.0f / ew::sqrt_f(var[i] + eps);
}

void batch_norm_forward(const float* x, const float* mean, const float* invstd, const float* gamma,
                        const float* beta, float* y, int64_t batch, int64_t channels,
                        int64_t spatial) {
  switch (active_isa()) {
    case cpu_isa::avx512:
      return bn_apply_avx512(x, mean, invstd, gamma, beta, y, batch, channels, spatial);
    case cpu_isa::avx2:
      return bn_apply_avx2(x, mean, invstd, gamma, beta, y, batch, channels, spatial);
    case cpu_isa::baseline:
      break;
  }
  bn_apply_baseline(x, mean, invstd, gamma, beta, y, batch, channels, spatial);
}

void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                              const float* invstd, int64_t batch, int64_t channels, int64_t spatial,
                              float* sums) {
  switch (active_isa()) {
    case cpu_isa::avx512:
      return bn_backward_sums_avx512(x, dy, mean, invstd, batch, channels, spatial, sums);
    case cpu_isa::avx2:
      return bn_backward_sums_avx2(x, dy, mean, invstd, batch, channels, spatial, sums);
    case cpu_isa::baseline:
      break;
  }
  bn_backward_sums(x, dy, mean, invstd, batch, channels, spatial, sums);
}

void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                         const float* gamma, const float* sums, double count, float* dx,
                         int64_t batch, int64_t channels, int64_t spatial) {
  switch (active_isa()) {
    case cpu_isa::avx512:
      return bn_apply_backward_avx512(x, dy, mean, invstd, gamma, sums, count, dx, batch, channels,
                                      spatial);
    case cpu_isa::avx2:
      return bn_apply_backward_avx2(x, dy, mean, invstd, gamma, sums, count, dx, batch, channels,
                                    spatial);
    case cpu_isa::baseline:
      break;
  }
  bn_apply_backward_baseline(x, dy, mean, invstd, gamma, sums, count, dx, batch, channels, spatial);
}

// ---- layer normalisation ------------------------------------------------------

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* invstd, int64_t rows, int64_t cols, float eps) {
  const std::size_t n = sz(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + sz(r) * n;
    float* yr = y + sz(r) * n;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (std::size_t j = 0; j < n; ++j) s += xr[j];
    const double m = n ? s / static_cast<double>(n) : 0.0;
    double q = 0;  // two passes: the row is in L1, and no cancellation
#pragma omp simd reduction(+ : q)
    for (std::size_t j = 0; j < n; ++j) {
      const double d = xr[j] - m;
      q += d * d;
    }
    const double var = n ? q / static_cast<double>(n) : 0.0;
    const float mf = static_cast<float>(m);
    const float is = static_cast<float>(1.0 / ::sqrt(var + static_cast<double>(eps)));
    if (mean) mean[r] = mf;  // inference keeps neither
    if (invstd) invstd[r] = is;
    for (std::size_t j = 0; j < n; ++j) {
      const float h = (xr[j] - mf) * is;
      yr[j] = h * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
    }
  }
}

void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                         const float* invstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                         int64_t cols, bool accumulate) {
  const std::size_t n = sz(cols);
  if (!accumulate) {
    if (dgamma) zero(dgamma, n);
    if (dbeta) zero(dbeta, n);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + sz(r) * n;
    const float* dr = dy + sz(r) * n;
    const float m = mean[r], is = invstd[r];
    // dx = invstd (g - mean(g) - xhat mean(g xhat)), g = dy * gamma.
    double sg = 0, sgx = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const float h = (xr[j] - m) * is;
      const double g = static_cast<double>(dr[j]) * (gamma ? gamma[j] : 1.0f);
      sg += g;
      sgx += g * h;
      if (dgamma) dgamma[j] += dr[j] * h;
      if (dbeta) dbeta[j] += dr[j];
    }
    if (!dx) continue;
    const float mg = static_cast<float>(n ? sg / static_cast<double>(n) : 0.0);
    const float mgx = static_cast<float>(n ? sgx / static_cast<double>(n) : 0.0);
    float* out = dx + sz(r) * n;
    for (std::size_t j = 0; j < n; ++j) {
      const float h = (xr[j] - m) * is;
      const float g = dr[j] * (gamma ? gamma[j] : 1.0f);
      out[j] = is * (g - mg - h * mgx);
    }
  }
}

// ---- dropout, embedding ---------------------------------------------------------

void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
             const int64_t* ids) {
  const std::size_t n = sz(cols);
  if (rate <= 0.0f) {
    if (y != x) std::memmove(y, x, sz(rows) * n * sizeof(float));
    return;
  }
  if (active_isa() == cpu_isa::avx512)
    dropout_avx512(x, y, rows, cols, rate, seed, ids);
  else
    dropout_rows(x, y, rows, cols, rate, seed, ids);
}

void embedding_forward(const float* ids, const float* table, float* out, int64_t rows, int64_t len,
                       int64_t dim, bool bag_mean) {
  const std::size_t d = sz(dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float* ir = ids + sz(r) * sz(len);
    if (bag_mean) {
      float* o = out + sz(r) * d;
      zero(o, d);
      for (int64_t l = 0; l < len; ++l) {
        const float* row = table + static_cast<std::size_t>(ir[l]) * d;
        for (std::size_t j = 0; j < d; ++j) o[j] += row[j];
      }
      if (len > 0) {
        const float inv = 1.0f / static_cast<float>(len);
        for (std::size_t j = 0; j < d; ++j) o[j] *= inv;
      }
    } else {
      for (int64_t l = 0; l < len; ++l)
        std::memcpy(out + (sz(r) * sz(len) + sz(l)) * d,
                    table + static_cast<std::size_t>(ir[l]) * d, d * sizeof(float));
    }
  }
}

void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t len,
                        int64_t vocab, int64_t dim, bool bag_mean, bool accumulate) {
  const std::size_t d = sz(dim);
  if (!accumulate) zero(dtable, sz(vocab) * d);
  const float inv = len > 0 ? 1.0f / static_cast<float>(len) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ir = ids + sz(r) * sz(len);
    for (int64_t l = 0; l < len; ++l) {
      const int64_t id = static_cast<int64_t>(ir[l]);
      if (id < 0 || id >= vocab) continue;  // checked by the caller; never write outside
      float* row = dtable + sz(id) * d;
      if (bag_mean) {
        const float* g = dy + sz(r) * d;
        for (std::size_t j = 0; j < d; ++j) row[j] += g[j] * inv;
      } else {
        const float* g = dy + (sz(r) * sz(len) + sz(l)) * d;
        for (std::size_t j = 0; j < d; ++j) row[j] += g[j];
      }
    }
  }
}

// ---- losses ---------------------------------------------------------------------

void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                           int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                           int64_t* correct) {
  const std::size_t n = sz(outputs);
  double total = 0;
  int64_t hits = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* z = logits + sz(r) * n;
    const float* t = targets + sz(r) * n;
    bool all = true;
    double row = 0;
    for (std::size_t j = 0; j < n; ++j) {
      row += ew::bce_loss(z[j], t[j]);
      all = all && ew::bce_correct(z[j], t[j]);
    }
    // Written after the row's reads: dlogits may alias logits.
    if (dlogits) {
      float* d = dlogits + sz(r) * n;
      for (std::size_t j = 0; j < n; ++j) d[j] = ew::bce_dlogit(z[j], t[j], grad_scale);
    }
    total += row;
    hits += all ? 1 : 0;
  }
  if (loss_sum) *loss_sum += total;
  if (correct) *correct += hits;
}

void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                        float grad_scale, float* dpred, double* loss_sum) {
  const std::size_t n = sz(outputs);
  const float g = outputs > 0 ? 2.0f * grad_scale / static_cast<float>(outputs) : 0.0f;
  double total = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* p = pred + sz(r) * n;
    const float* t = targets + sz(r) * n;
    double row = 0;
#pragma omp simd reduction(+ : row)
    for (std::size_t j = 0; j < n; ++j) {
      const double e = static_cast<double>(p[j]) - t[j];
      row += e * e;
    }
    if (dpred) {
      float* d = dpred + sz(r) * n;
      for (std::size_t j = 0; j < n; ++j) d[j] = (p[j] - t[j]) * g;
    }
    total += n ? row / static_cast<double>(n) : 0.0;
  }
  if (loss_sum) *loss_sum += total;
}

}  // namespace troupe::kernels::cpu
