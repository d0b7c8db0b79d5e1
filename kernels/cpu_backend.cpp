// The backend interface over the CPU kernels: every call runs to completion
// on the calling thread (a device thread), so ordering is program order.
#include <cstring>

#include "kernels/backend.hpp"
#include "kernels/cpu_kernels.hpp"

namespace troupe::kernels {
namespace {

class cpu_backend_impl final : public backend {
 public:
  const char* name() const override { return "cpu"; }
  void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                     int64_t in, int64_t out, activation act) override {
    kernels::dense_forward(x, w, b, y, batch, in, out, act);
  }
  void activation_backward_bias(activation act, const float* y, const float* dy, float* dx,
                                float* db, int64_t rows, int64_t cols, bool accumulate) override {
    kernels::activation_backward_bias(act, y, dy, dx, db, rows, cols, accumulate);
  }
  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int64_t batch, int64_t in, int64_t out, bool accumulate) override {
    kernels::dense_backward(x, w, dy, dx, dw, db, batch, in, out, accumulate);
  }
  void relu_forward(const float* x, float* y, std::size_t n) override {
    kernels::relu_forward(x, y, n);
  }
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    kernels::relu_backward(y, dy, dx, n);
  }
  void tanh_forward(const float* x, float* y, std::size_t n) override {
    kernels::tanh_forward(x, y, n);
  }
  void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    kernels::tanh_backward(y, dy, dx, n);
  }
  void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                             int64_t classes, float grad_scale, float* dlogits, double* loss_sum,
                             int64_t* correct) override {
    *loss_sum += kernels::softmax_cross_entropy(logits, labels, batch, classes, grad_scale, dlogits,
                                                correct);
  }
  void fill(float* x, float v, std::size_t n) override { kernels::fill(x, v, n); }
  void fill_stats(double* loss_sum, int64_t* correct) override {
    *loss_sum = 0;
    *correct = 0;
  }
  void copy(float* dst, const float* src, std::size_t n) override {
    if (dst != src) std::memcpy(dst, src, n * sizeof(float));
  }
  void add_inplace(float* acc, const float* x, std::size_t n) override {
    kernels::add_inplace(acc, x, n);
  }
  void scale_inplace(float* x, float s, std::size_t n) override { kernels::scale_inplace(x, s, n); }
  void sgd_step(float* w, const float* g, std::size_t n, float lr, float wd) override {
    kernels::sgd_step(w, g, n, lr, wd);
  }
  void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                     bool nesterov, float wd) override {
    kernels::momentum_step(w, v, g, n, lr, mu, nesterov, wd);
  }
  void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
                 float b2, float eps, int64_t step, float wd, bool decoupled) override {
    kernels::adam_step(w, m, v, g, n, lr, b1, b2, eps, step, wd, decoupled);
  }
  void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                    float eps, float wd) override {
    kernels::rmsprop_step(w, ms, g, n, lr, rho, eps, wd);
  }
  void decoupled_decay_step(float* w, std::size_t n, float lr, float wd) override {
    kernels::decoupled_decay_step(w, n, lr, wd);
  }
};

}  // namespace

backend& cpu_backend() {
  static cpu_backend_impl b;
  return b;
}

}  // namespace troupe::kernels
