#pragma once
// recording_backend: the sim:N device's stand-in for stream capture. While a
// step is captured (device_context::capture) every backend call is recorded,
// with its arguments, instead of run; launching the recording runs the calls
// again in order on the CPU backend. Like a CUDA graph, a replay sees only
// what the recorded arguments point to: a value the step took from the host
// at capture time (a learning rate, a step count, a batch's address) is
// replayed as it was then, so a step that is wrong to capture gives wrong
// numbers on sim:N too, and the CPU test suite catches it. The calls hold
// the inner backend (the CPU's, which lives as long as the process), not the
// recorder, which goes when the capture ends.
#include <functional>
#include <vector>

#include "kernels/backend.hpp"

namespace troupe {

class recording_backend final : public kernels::backend {
 public:
  using call = std::function<void()>;
  recording_backend(kernels::backend& inner, std::vector<call>& out) : inner_(inner), out_(out) {}
  const char* name() const override { return "recording"; }
  std::size_t pool2d_workspace_bytes(const kernels::pool2d_shape& s) override {
    return inner_.pool2d_workspace_bytes(s);
  }

  void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                     int64_t in, int64_t out, kernels::activation act) override {
    add([=, &inner = inner_] { inner.dense_forward(x, w, b, y, batch, in, out, act); });
  }
  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int64_t batch, int64_t in, int64_t out, bool accumulate) override {
    add([=, &inner = inner_] {
      inner.dense_backward(x, w, dy, dx, dw, db, batch, in, out, accumulate);
    });
  }
  void activation_backward_bias(kernels::activation act, const float* y, const float* dy, float* dx,
                                float* db, int64_t rows, int64_t cols, bool accumulate) override {
    add([=, &inner = inner_] {
      inner.activation_backward_bias(act, y, dy, dx, db, rows, cols, accumulate);
    });
  }
  void relu_forward(const float* x, float* y, std::size_t n) override {
    add([=, &inner = inner_] { inner.relu_forward(x, y, n); });
  }
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    add([=, &inner = inner_] { inner.relu_backward(y, dy, dx, n); });
  }
  void tanh_forward(const float* x, float* y, std::size_t n) override {
    add([=, &inner = inner_] { inner.tanh_forward(x, y, n); });
  }
  void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    add([=, &inner = inner_] { inner.tanh_backward(y, dy, dx, n); });
  }
  void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                             int64_t classes, float grad_scale, float* dlogits, double* loss_sum,
                             int64_t* correct) override {
    add([=, &inner = inner_] {
      inner.softmax_cross_entropy(logits, labels, batch, classes, grad_scale, dlogits, loss_sum,
                                  correct);
    });
  }
  void conv2d_forward(const kernels::conv2d_shape& s, const float* x, const float* w,
                      const float* b, float* y) override {
    add([=, &inner = inner_] { inner.conv2d_forward(s, x, w, b, y); });
  }
  void conv2d_backward(const kernels::conv2d_shape& s, const float* x, const float* w,
                       const float* dy, float* dx, float* dw, float* db, bool accumulate) override {
    add([=, &inner = inner_] { inner.conv2d_backward(s, x, w, dy, dx, dw, db, accumulate); });
  }
  void pool2d_forward(const kernels::pool2d_shape& s, const float* x, float* y,
                      void* workspace) override {
    add([=, &inner = inner_] { inner.pool2d_forward(s, x, y, workspace); });
  }
  void pool2d_backward(const kernels::pool2d_shape& s, const float* x, const float* dy, float* dx,
                       const void* workspace) override {
    add([=, &inner = inner_] { inner.pool2d_backward(s, x, dy, dx, workspace); });
  }
  void unary_forward(kernels::unary_op op, float alpha, const float* x, float* y,
                     std::size_t n) override {
    add([=, &inner = inner_] { inner.unary_forward(op, alpha, x, y, n); });
  }
  void unary_backward(kernels::unary_op op, float alpha, const float* x, const float* y,
                      const float* dy, float* dx, std::size_t n) override {
    add([=, &inner = inner_] { inner.unary_backward(op, alpha, x, y, dy, dx, n); });
  }
  void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                       float* sums) override {
    add([=, &inner = inner_] { inner.batch_norm_sums(x, batch, channels, spatial, sums); });
  }
  void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                             float momentum, float* mean, float* invstd, float* running_mean,
                             float* running_var) override {
    add([=, &inner = inner_] {
      inner.batch_norm_statistics(sums, channels, count, eps, momentum, mean, invstd, running_mean,
                                  running_var);
    });
  }
  void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n) override {
    add([=, &inner = inner_] { inner.invstd_from_variance(var, eps, invstd, n); });
  }
  void batch_norm_forward(const float* x, const float* mean, const float* invstd,
                          const float* gamma, const float* beta, float* y, int64_t batch,
                          int64_t channels, int64_t spatial) override {
    add([=, &inner = inner_] {
      inner.batch_norm_forward(x, mean, invstd, gamma, beta, y, batch, channels, spatial);
    });
  }
  void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                                const float* invstd, int64_t batch, int64_t channels,
                                int64_t spatial, float* sums) override {
    add([=, &inner = inner_] {
      inner.batch_norm_backward_sums(x, dy, mean, invstd, batch, channels, spatial, sums);
    });
  }
  void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                           const float* gamma, const float* sums, double count, float* dx,
                           int64_t batch, int64_t channels, int64_t spatial) override {
    add([=, &inner = inner_] {
      inner.batch_norm_backward(x, dy, mean, invstd, gamma, sums, count, dx, batch, channels,
                                spatial);
    });
  }
  void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                          float* mean, float* invstd, int64_t rows, int64_t cols,
                          float eps) override {
    add([=, &inner = inner_] {
      inner.layer_norm_forward(x, gamma, beta, y, mean, invstd, rows, cols, eps);
    });
  }
  void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                           const float* invstd, float* dx, float* dgamma, float* dbeta,
                           int64_t rows, int64_t cols, bool accumulate) override {
    add([=, &inner = inner_] {
      inner.layer_norm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta, rows, cols,
                                accumulate);
    });
  }
  void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
               const int64_t* ids) override {
    add([=, &inner = inner_] { inner.dropout(x, y, rows, cols, rate, seed, ids); });
  }
  void dropout_at_step(const float* x, float* y, int64_t rows, int64_t cols, float rate,
                       uint64_t base, uint64_t layer, const int64_t* counter,
                       const int64_t* ids) override {
    add([=, &inner = inner_] {
      inner.dropout_at_step(x, y, rows, cols, rate, base, layer, counter, ids);
    });
  }
  void embedding_forward(const float* ids, const float* table, float* out, int64_t rows,
                         int64_t len, int64_t dim, bool bag_mean) override {
    add([=, &inner = inner_] {
      inner.embedding_forward(ids, table, out, rows, len, dim, bag_mean);
    });
  }
  void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows,
                          int64_t len, int64_t vocab, int64_t dim, bool bag_mean,
                          bool accumulate) override {
    add([=, &inner = inner_] {
      inner.embedding_backward(ids, dy, dtable, rows, len, vocab, dim, bag_mean, accumulate);
    });
  }
  void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                             int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                             int64_t* correct) override {
    add([=, &inner = inner_] {
      inner.sigmoid_cross_entropy(logits, targets, batch, outputs, grad_scale, dlogits, loss_sum,
                                  correct);
    });
  }
  void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                          float grad_scale, float* dpred, double* loss_sum) override {
    add([=, &inner = inner_] {
      inner.mean_squared_error(pred, targets, batch, outputs, grad_scale, dpred, loss_sum);
    });
  }
  void fill(float* x, float v, std::size_t n) override {
    add([=, &inner = inner_] { inner.fill(x, v, n); });
  }
  void fill_stats(double* loss_sum, int64_t* correct) override {
    add([=, &inner = inner_] { inner.fill_stats(loss_sum, correct); });
  }
  void copy(float* dst, const float* src, std::size_t n) override {
    add([=, &inner = inner_] { inner.copy(dst, src, n); });
  }
  void add_inplace(float* acc, const float* x, std::size_t n) override {
    add([=, &inner = inner_] { inner.add_inplace(acc, x, n); });
  }
  void scale_inplace(float* x, float s, std::size_t n) override {
    add([=, &inner = inner_] { inner.scale_inplace(x, s, n); });
  }
  void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay) override {
    add([=, &inner = inner_] { inner.sgd_step(w, g, n, lr, weight_decay); });
  }
  void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                     bool nesterov, float weight_decay) override {
    add([=, &inner = inner_] { inner.momentum_step(w, v, g, n, lr, mu, nesterov, weight_decay); });
  }
  void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
                 float b2, float eps, int64_t step, float weight_decay, bool decoupled) override {
    add([=, &inner = inner_] {
      inner.adam_step(w, m, v, g, n, lr, b1, b2, eps, step, weight_decay, decoupled);
    });
  }
  void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                    float eps, float weight_decay) override {
    add([=, &inner = inner_] { inner.rmsprop_step(w, ms, g, n, lr, rho, eps, weight_decay); });
  }
  void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay) override {
    add([=, &inner = inner_] { inner.decoupled_decay_step(w, n, lr, weight_decay); });
  }
  void gather_planned_rows(row_set a, row_set b, const int64_t* plan, const int64_t* counter,
                           int64_t rows, int64_t* ids) override {
    add([=, &inner = inner_] { inner.gather_planned_rows(a, b, plan, counter, rows, ids); });
  }
  void record_step_stats(double* loss_sum, int64_t* correct, int64_t* counter, double* loss_out,
                         int64_t* correct_out) override {
    add([=, &inner = inner_] {
      inner.record_step_stats(loss_sum, correct, counter, loss_out, correct_out);
    });
  }
  void adam_step_scheduled(const kernels::adam_tensors& t, const float* scalars,
                           const int64_t* counter, float b1, float b2, float eps,
                           float weight_decay, bool decoupled) override {
    add([=, &inner = inner_] {
      inner.adam_step_scheduled(t, scalars, counter, b1, b2, eps, weight_decay, decoupled);
    });
  }

 private:
  void add(call c) { out_.push_back(std::move(c)); }
  kernels::backend& inner_;
  std::vector<call>& out_;
};

}  // namespace troupe
