#include "kernels/cpu_kernels.hpp"

#include <cblas.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/elementwise.hpp"

namespace troupe::kernels {

namespace {

std::once_flag blas_once;

// BLAS takes (32-bit, unless OpenBLAS was built with INTERFACE64) blasint
// sizes; refuse anything that does not fit instead of silently truncating.
blasint blas_dim(int64_t v, const char* what) {
  if (v < 0 || v > static_cast<int64_t>(std::numeric_limits<blasint>::max()))
    throw std::invalid_argument(std::string("dense: dimension ") + what + " = " +
                                std::to_string(v) + " out of range");
  return static_cast<blasint>(v);
}

}  // namespace

void init_cpu_kernels() {
  std::call_once(blas_once, [] { openblas_set_num_threads(1); });
}

void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                   int64_t in, int64_t out) {
  init_cpu_kernels();
  const blasint m = blas_dim(batch, "batch");
  const blasint k = blas_dim(in, "in");
  const blasint n = blas_dim(out, "out");
  if (m == 0 || n == 0) return;
  const std::size_t cols = static_cast<std::size_t>(n);
  for (blasint r = 0; r < m; ++r) {
    float* yr = y + static_cast<std::size_t>(r) * cols;
    if (b) {
      for (std::size_t j = 0; j < cols; ++j) yr[j] = b[j];
    } else {
      for (std::size_t j = 0; j < cols; ++j) yr[j] = 0.0f;
    }
  }
  if (k == 0) return;
  // y = 1 * x[m,k] * w[k,n] + 1 * y   (y already holds the bias or zeros)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, x, k, w, n, 1.0f, y, n);
}

void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, int64_t batch, int64_t in, int64_t out, bool accumulate) {
  init_cpu_kernels();
  const blasint m = blas_dim(batch, "batch");
  const blasint k = blas_dim(in, "in");
  const blasint n = blas_dim(out, "out");
  const std::size_t cols = static_cast<std::size_t>(n);

  // dw[k,n] = x^T[k,m] dy[m,n]  (+ dw when accumulating)
  if (dw && k > 0 && n > 0) {
    if (m > 0) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, m, 1.0f, x, k, dy, n,
                  accumulate ? 1.0f : 0.0f, dw, n);
    } else if (!accumulate) {
      const std::size_t total = static_cast<std::size_t>(k) * cols;
      for (std::size_t i = 0; i < total; ++i) dw[i] = 0.0f;
    }
  }

  // db[n] = sum over rows of dy
  if (db) {
    if (!accumulate)
      for (std::size_t j = 0; j < cols; ++j) db[j] = 0.0f;
    for (blasint r = 0; r < m; ++r) {
      const float* dyr = dy + static_cast<std::size_t>(r) * cols;
      for (std::size_t j = 0; j < cols; ++j) db[j] += dyr[j];
    }
  }

  // dx[m,k] = dy[m,n] w^T[n,k]
  if (dx && m > 0 && k > 0) {
    if (n > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, k, n, 1.0f, dy, n, w, n, 0.0f, dx, k);
    } else {
      const std::size_t total = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
      for (std::size_t i = 0; i < total; ++i) dx[i] = 0.0f;
    }
  }
}

void relu_forward(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = ew::relu(x[i]);
}

void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = ew::relu_grad(y[i], dy[i]);
}

void tanh_forward(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = ew::tanh_act(x[i]);
}

void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = ew::tanh_grad(y[i], dy[i]);
}

double softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                             int64_t classes, float grad_scale, float* dlogits, int64_t* correct) {
  if (batch < 0 || classes <= 0)
    throw std::invalid_argument("softmax_cross_entropy: batch " + std::to_string(batch) +
                                ", classes " + std::to_string(classes));
  // Validate every label before writing anything (dlogits may alias logits).
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t lab = labels[r];
    if (lab < 0 || lab >= classes)
      throw std::out_of_range("softmax_cross_entropy: label " + std::to_string(lab) + " at row " +
                              std::to_string(r) + " outside [0, " + std::to_string(classes) + ")");
  }
  const std::size_t c = static_cast<std::size_t>(classes);
  double loss = 0.0;
  int64_t hits = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* lr = logits + static_cast<std::size_t>(r) * c;
    const std::size_t lab = static_cast<std::size_t>(labels[r]);
    // Row max (for stability) and argmax (first maximum wins ties).
    float mx = lr[0];
    std::size_t arg = 0;
    for (std::size_t j = 1; j < c; ++j) {
      if (lr[j] > mx) {
        mx = lr[j];
        arg = j;
      }
    }
    if (arg == lab) ++hits;
    double sum = 0.0;
    for (std::size_t j = 0; j < c; ++j) sum += static_cast<double>(ew::exp_f(lr[j] - mx));
    // loss = log(sum_j exp(l_j)) - l_label = mx + log(sum) - l_label
    loss += ew::ce_row_loss(mx, sum, lr[lab]);
    if (dlogits) {
      float* dr = dlogits + static_cast<std::size_t>(r) * c;
      const float inv = static_cast<float>(1.0 / sum);
      // Reads lr[j] before writing dr[j]: safe when dlogits aliases logits.
      for (std::size_t j = 0; j < c; ++j) dr[j] = ew::ce_dlogit(lr[j], mx, inv, grad_scale);
      dr[lab] -= grad_scale;
    }
  }
  if (correct) *correct += hits;
  return loss;
}

double reduce_sum(const float* x, std::size_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
  return s;
}

double reduce_mean(const float* x, std::size_t n) {
  if (n == 0) return 0.0;
  return reduce_sum(x, n) / static_cast<double>(n);
}

float reduce_min(const float* x, std::size_t n) {
  if (n == 0) throw std::invalid_argument("reduce_min: empty input");
  float m = x[0];
#pragma omp simd reduction(min : m)
  for (std::size_t i = 1; i < n; ++i) m = ew::min_f(m, x[i]);
  return m;
}

float reduce_max(const float* x, std::size_t n) {
  if (n == 0) throw std::invalid_argument("reduce_max: empty input");
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (std::size_t i = 1; i < n; ++i) m = ew::max_f(m, x[i]);
  return m;
}

void add_inplace(float* acc, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
}

void scale_inplace(float* x, float s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= s;
}

void min_inplace(float* acc, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] = ew::min_f(acc[i], x[i]);
}

void max_inplace(float* acc, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] = ew::max_f(acc[i], x[i]);
}

void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay) {
  for (std::size_t i = 0; i < n; ++i) ew::sgd_update(w[i], g[i], lr, weight_decay);
}

void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                   bool nesterov, float weight_decay) {
  for (std::size_t i = 0; i < n; ++i)
    ew::momentum_update(w[i], v[i], g[i], lr, mu, nesterov, weight_decay);
}

void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
               float b2, float eps, int64_t step, float weight_decay, bool decoupled) {
  if (step < 1)
    throw std::invalid_argument("adam_step: step must be >= 1 (1-based), got " +
                                std::to_string(step));
  const double t = static_cast<double>(step);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
  for (std::size_t i = 0; i < n; ++i)
    ew::adam_update(w[i], m[i], v[i], g[i], lr, b1, b2, eps, bc1, bc2, weight_decay, decoupled);
}

void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                  float eps, float weight_decay) {
  for (std::size_t i = 0; i < n; ++i)
    ew::rmsprop_update(w[i], ms[i], g[i], lr, rho, eps, weight_decay);
}

void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay) {
  for (std::size_t i = 0; i < n; ++i) ew::decoupled_decay(w[i], lr, weight_decay);
}

}  // namespace troupe::kernels
