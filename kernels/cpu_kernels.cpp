#include "kernels/cpu_kernels.hpp"
#include "kernels/elementwise.hpp"

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/onednn.hpp"
#include "kernels/vector_kernels.hpp"

namespace troupe::kernels {

namespace {

const vector_kernels& vk() {
  return active_vector_kernels();
}

void check_dim(int64_t v, const char* what) {
  if (v < 0)
    throw std::invalid_argument(std::string("dense: dimension ") + what + " = " +
                                std::to_string(v) + " out of range");
}

}  // namespace

void init_cpu_kernels() {
  (void)active_vector_kernels();
  (void)onednn::effective_isa();
}

double measure_sgemm_gflops(double seconds) {
  constexpr int64_t m = 128, k = 784, n = 256;
  std::vector<float> x(m * k, 0.5f), w(k * n, 0.01f), b(n, 0.0f), y(m * n);
  dense_forward(x.data(), w.data(), b.data(), y.data(), m, k, n);  // makes the primitive
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int64_t runs = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 8; ++i) dense_forward(x.data(), w.data(), b.data(), y.data(), m, k, n);
    runs += 8;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  } while (elapsed < seconds);
  return 2.0 * m * k * n * static_cast<double>(runs) / elapsed / 1e9;
}

std::string describe_cpu_kernels(bool measure) {
  std::string s = "oneDNN " + onednn::version() + " " + onednn::effective_isa() + ", loops " +
                  isa_name(active_isa());
  if (active_isa() != detected_isa())
    s += std::string(" (forced by TROUPE_CPU_ISA; the CPU supports ") + isa_name(detected_isa()) +
         ")";
  if (measure) {
    char rate[64];
    std::snprintf(rate, sizeof rate, ", sgemm %.0f GFLOP/s on 1 thread",
                  measure_sgemm_gflops(0.01));
    s += rate;
  }
  return s;
}

void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                   int64_t in, int64_t out, activation act) {
  check_dim(batch, "batch");
  check_dim(in, "in");
  check_dim(out, "out");
  if (batch == 0 || out == 0) return;
  const std::size_t total = static_cast<std::size_t>(batch) * static_cast<std::size_t>(out);
  if (in == 0) {  // no product: the bias (or zeros) through the activation
    for (int64_t r = 0; r < batch; ++r) {
      float* yr = y + static_cast<std::size_t>(r) * static_cast<std::size_t>(out);
      if (b)
        for (int64_t j = 0; j < out; ++j) yr[j] = b[j];
      else
        vk().fill(yr, 0.0f, static_cast<std::size_t>(out));
    }
    if (act == activation::relu) vk().relu_forward(y, y, total);
    if (act == activation::tanh) vk().tanh_forward(y, y, total);
    return;
  }
  onednn::dense_forward(x, w, b, y, batch, in, out, act);
  if (act == activation::tanh) vk().tanh_forward(y, y, total);
}

void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, int64_t batch, int64_t in, int64_t out, bool accumulate) {
  check_dim(batch, "batch");
  check_dim(in, "in");
  check_dim(out, "out");
  // dw[in,out] = x^T dy  (+ dw when accumulating)
  if (dw && in > 0 && out > 0) {
    if (batch > 0)
      onednn::weight_gradient(x, dy, dw, batch, in, out, accumulate);
    else if (!accumulate)
      vk().fill(dw, 0.0f, static_cast<std::size_t>(in) * static_cast<std::size_t>(out));
  }
  if (db) vk().column_sums(dy, db, batch, out, accumulate);
  // dx[batch,in] = dy w^T
  if (dx && batch > 0 && in > 0) {
    if (out > 0)
      onednn::input_gradient(dy, w, dx, batch, in, out);
    else
      vk().fill(dx, 0.0f, static_cast<std::size_t>(batch) * static_cast<std::size_t>(in));
  }
}

void activation_backward_bias(activation act, const float* y, const float* dy, float* dx, float* db,
                              int64_t rows, int64_t cols, bool accumulate) {
  check_dim(rows, "rows");
  check_dim(cols, "cols");
  vk().activation_backward_bias(act, y, dy, dx, db, rows, cols, accumulate);
}

void column_sums(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate) {
  check_dim(rows, "rows");
  check_dim(cols, "cols");
  vk().column_sums(dy, db, rows, cols, accumulate);
}

void relu_forward(const float* x, float* y, std::size_t n) {
  vk().relu_forward(x, y, n);
}
void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) {
  vk().relu_backward(y, dy, dx, n);
}
void tanh_forward(const float* x, float* y, std::size_t n) {
  vk().tanh_forward(x, y, n);
}
void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n) {
  vk().tanh_backward(y, dy, dx, n);
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
  int64_t hits = 0;
  const double loss =
      vk().softmax_cross_entropy(logits, labels, batch, classes, grad_scale, dlogits, &hits);
  if (correct) *correct += hits;
  return loss;
}

double reduce_sum(const float* x, std::size_t n) {
  return vk().reduce_sum(x, n);
}

double reduce_mean(const float* x, std::size_t n) {
  if (n == 0) return 0.0;
  return reduce_sum(x, n) / static_cast<double>(n);
}

float reduce_min(const float* x, std::size_t n) {
  if (n == 0) throw std::invalid_argument("reduce_min: empty input");
  return vk().reduce_min(x, n);
}

float reduce_max(const float* x, std::size_t n) {
  if (n == 0) throw std::invalid_argument("reduce_max: empty input");
  return vk().reduce_max(x, n);
}

void add_inplace(float* acc, const float* x, std::size_t n) {
  vk().add_inplace(acc, x, n);
}
void scale_inplace(float* x, float s, std::size_t n) {
  vk().scale_inplace(x, s, n);
}
void min_inplace(float* acc, const float* x, std::size_t n) {
  vk().min_inplace(acc, x, n);
}
void max_inplace(float* acc, const float* x, std::size_t n) {
  vk().max_inplace(acc, x, n);
}
void fill(float* x, float v, std::size_t n) {
  vk().fill(x, v, n);
}
void decode_bytes(const uint8_t* src, const float* table, float* out, std::size_t n) {
  vk().decode_bytes(src, table, out, n);
}
void sum_sources(float* dst, const float* const* src, std::size_t m, std::size_t n, float scale) {
  if (m == 0) throw std::invalid_argument("sum_sources: no sources");
  vk().sum_sources(dst, src, m, n, scale);
}

void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay) {
  vk().sgd_step(w, g, n, lr, weight_decay);
}

void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                   bool nesterov, float weight_decay) {
  vk().momentum_step(w, v, g, n, lr, mu, nesterov, weight_decay);
}

void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
               float b2, float eps, int64_t step, float weight_decay, bool decoupled) {
  if (step < 1)
    throw std::invalid_argument("adam_step: step must be >= 1 (1-based), got " +
                                std::to_string(step));
  const auto k = ew::adam_scalars_for(lr, b1, b2, step);
  adam_step_with(w, m, v, g, n, lr, k.step_size, k.inv_sqrt_bc2, b1, b2, eps, weight_decay,
                 decoupled);
}

void adam_step_with(float* w, float* m, float* v, const float* g, std::size_t n, float lr,
                    float step_size, float inv_sqrt_bc2, float b1, float b2, float eps,
                    float weight_decay, bool decoupled) {
  vk().adam_step(w, m, v, g, n, lr, b1, b2, eps, step_size, inv_sqrt_bc2, weight_decay, decoupled);
}

void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                  float eps, float weight_decay) {
  vk().rmsprop_step(w, ms, g, n, lr, rho, eps, weight_decay);
}

void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay) {
  vk().decoupled_decay_step(w, n, lr, weight_decay);
}

}  // namespace troupe::kernels
