// The backend interface over the CPU kernels: every call runs to completion
// on the calling thread (a device thread), so ordering is program order.
#include <cstring>
#include <utility>

#include "kernels/backend.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/cpu_layers.hpp"

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
  void conv2d_forward(const conv2d_shape& s, const float* x, const float* w, const float* b,
                      float* y) override {
    cpu::conv2d_forward(s, x, w, b, y);
  }
  void conv2d_backward(const conv2d_shape& s, const float* x, const float* w, const float* dy,
                       float* dx, float* dw, float* db, bool accumulate) override {
    cpu::conv2d_backward(s, x, w, dy, dx, dw, db, accumulate);
  }
  std::size_t pool2d_workspace_bytes(const pool2d_shape& s) override {
    return cpu::pool2d_workspace_bytes(s);
  }
  void pool2d_forward(const pool2d_shape& s, const float* x, float* y, void* workspace) override {
    cpu::pool2d_forward(s, x, y, workspace);
  }
  void pool2d_backward(const pool2d_shape& s, const float* x, const float* dy, float* dx,
                       const void* workspace) override {
    cpu::pool2d_backward(s, x, dy, dx, workspace);
  }
  void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n) override {
    cpu::unary_forward(op, alpha, x, y, n);
  }
  void unary_backward(unary_op op, float alpha, const float* x, const float* y, const float* dy,
                      float* dx, std::size_t n) override {
    cpu::unary_backward(op, alpha, x, y, dy, dx, n);
  }
  void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                       float* sums) override {
    cpu::batch_norm_sums(x, batch, channels, spatial, sums);
  }
  void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                             float momentum, float* mean, float* invstd, float* running_mean,
                             float* running_var) override {
    cpu::batch_norm_statistics(sums, channels, count, eps, momentum, mean, invstd, running_mean,
                               running_var);
  }
  void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n) override {
    cpu::invstd_from_variance(var, eps, invstd, n);
  }
  void batch_norm_forward(const float* x, const float* mean, const float* invstd,
                          const float* gamma, const float* beta, float* y, int64_t batch,
                          int64_t channels, int64_t spatial) override {
    cpu::batch_norm_forward(x, mean, invstd, gamma, beta, y, batch, channels, spatial);
  }
  void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                                const float* invstd, int64_t batch, int64_t channels,
                                int64_t spatial, float* sums) override {
    cpu::batch_norm_backward_sums(x, dy, mean, invstd, batch, channels, spatial, sums);
  }
  void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                           const float* gamma, const float* sums, double count, float* dx,
                           int64_t batch, int64_t channels, int64_t spatial) override {
    cpu::batch_norm_backward(x, dy, mean, invstd, gamma, sums, count, dx, batch, channels, spatial);
  }
  void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                          float* mean, float* invstd, int64_t rows, int64_t cols,
                          float eps) override {
    cpu::layer_norm_forward(x, gamma, beta, y, mean, invstd, rows, cols, eps);
  }
  void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                           const float* invstd, float* dx, float* dgamma, float* dbeta,
                           int64_t rows, int64_t cols, bool accumulate) override {
    cpu::layer_norm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta, rows, cols, accumulate);
  }
  void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
               const int64_t* ids) override {
    cpu::dropout(x, y, rows, cols, rate, seed, ids);
  }
  void dropout_at_step(const float* x, float* y, int64_t rows, int64_t cols, float rate,
                       uint64_t base, uint64_t layer, const int64_t* counter,
                       const int64_t* ids) override {
    cpu::dropout(x, y, rows, cols, rate, dropout_step_seed(base, counter[0], layer), ids);
  }
  void embedding_forward(const float* ids, const float* table, float* out, int64_t rows,
                         int64_t len, int64_t dim, bool bag_mean) override {
    cpu::embedding_forward(ids, table, out, rows, len, dim, bag_mean);
  }
  void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows,
                          int64_t len, int64_t vocab, int64_t dim, bool bag_mean,
                          bool accumulate) override {
    cpu::embedding_backward(ids, dy, dtable, rows, len, vocab, dim, bag_mean, accumulate);
  }
  void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                             int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                             int64_t* correct) override {
    cpu::sigmoid_cross_entropy(logits, targets, batch, outputs, grad_scale, dlogits, loss_sum,
                               correct);
  }
  void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                          float grad_scale, float* dpred, double* loss_sum) override {
    cpu::mean_squared_error(pred, targets, batch, outputs, grad_scale, dpred, loss_sum);
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

  void gather_planned_rows(row_set a, row_set b, const int64_t* plan, const int64_t* counter,
                           int64_t rows, int64_t* ids) override {
    const int64_t* row = plan + plan[counter[0] - counter[1]];
    for (const row_set& s : {a, b}) {
      if (!s.src) continue;
      const auto bytes = static_cast<std::size_t>(s.words) * 4;
      const auto* from = static_cast<const unsigned char*>(s.src);
      auto* to = static_cast<unsigned char*>(s.dst);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(to + static_cast<std::size_t>(r) * bytes,
                    from + static_cast<std::size_t>(row[r]) * bytes, bytes);
    }
    if (ids) std::memcpy(ids, row, static_cast<std::size_t>(rows) * sizeof(int64_t));
  }
  void record_step_stats(double* loss_sum, int64_t* correct, int64_t* counter, double* loss_out,
                         int64_t* correct_out) override {
    const int64_t k = counter[0] - counter[1];
    loss_out[k] = std::exchange(*loss_sum, 0.0);
    correct_out[k] = std::exchange(*correct, 0);
    ++counter[0];
  }
  void adam_step_scheduled(const adam_tensors& t, const float* scalars, const int64_t* counter,
                           float b1, float b2, float eps, float wd, bool decoupled) override {
    const float* s = scalars + 3 * counter[0];
    for (std::size_t i = 0; i < t.w.size(); ++i)
      kernels::adam_step_with(t.w[i], t.m[i], t.v[i], t.g[i], t.n[i], s[0], s[1], s[2], b1, b2, eps,
                              wd, decoupled);
  }
};

}  // namespace

backend& cpu_backend() {
  static cpu_backend_impl b;
  return b;
}

}  // namespace troupe::kernels
