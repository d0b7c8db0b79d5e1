#pragma once
// backend: the compute operations a model and an optimizer need, on pointers
// in one device's memory. cpu_backend() runs them on the calling thread with
// the CPU kernels (kernels/cpu_kernels.hpp); the CUDA backend
// (kernels/cuda_backend.hpp) enqueues the same operations on its device's
// compute stream (cuBLAS for the dense layers, kernels/cuda_kernels.cu for
// the rest, whose element-wise math is kernels/elementwise.hpp, shared with
// the CPU). Everything a model computes goes through here, so a model written
// once runs on every device, and the orchestration around it is tested on the
// CPU.
//
// Calls are ordered as issued (a CUDA stream, or the calling thread); they may
// return before the work is done. Results reach the host only through the
// device context's copy_to_host (devices/device_context.hpp).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/activation.hpp"
#include "kernels/layer_ops.hpp"

namespace troupe::kernels {

// Tensors updated together (backend::adam_step_scheduled): tensor i is
// w[i], its gradient g[i] and Adam's moments m[i], v[i], n[i] floats each.
struct adam_tensors {
  std::vector<float*> w, m, v;
  std::vector<const float*> g;
  std::vector<std::size_t> n;
};

// Where FP32 work may run on TF32 tensor cores (training.tf32); a backend
// without them ignores it.
struct tf32_use {
  bool convolutions = false;
  bool matmuls = false;
};

class backend {
 public:
  virtual ~backend() = default;
  virtual const char* name() const = 0;
  // Set before the first operation of a shape: plans made earlier keep theirs.
  virtual void use_tf32(tf32_use) {}

  // y[batch,out] = act(x[batch,in] * w[in,out] + b[out]) (b may be null);
  // row-major. The bias and activation are the product's epilogue where the
  // device's library allows it.
  virtual void dense_forward(const float* x, const float* w, const float* b, float* y,
                             int64_t batch, int64_t in, int64_t out, activation act) = 0;
  // dw = x^T dy, db = column sums of dy, dx = dy w^T (dx, db may be null);
  // accumulate adds to dw/db instead of overwriting.
  virtual void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                              float* db, int64_t batch, int64_t in, int64_t out,
                              bool accumulate) = 0;

  // The backward of an activation and the bias gradient of the layer that
  // produced it: dx[rows,cols] = act'(y) * dy (y: the activation's output;
  // dx may alias dy) and db (+)= column sums of dx (db may be null).
  virtual void activation_backward_bias(activation act, const float* y, const float* dy, float* dx,
                                        float* db, int64_t rows, int64_t cols, bool accumulate) = 0;

  virtual void relu_forward(const float* x, float* y, std::size_t n) = 0;
  virtual void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) = 0;
  virtual void tanh_forward(const float* x, float* y, std::size_t n) = 0;
  virtual void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n) = 0;

  // Fused softmax + cross-entropy over logits[batch,classes] with labels in
  // [0, classes) (the caller checks them on the host: a device cannot throw).
  // Writes dlogits = (softmax - onehot) * grad_scale (null: none); ADDS the
  // sum of per-example losses to *loss_sum and the number of correct argmax
  // predictions to *correct, both in device memory.
  virtual void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                                     int64_t classes, float grad_scale, float* dlogits,
                                     double* loss_sum, int64_t* correct) = 0;

  // ---- layers (shapes and conventions: kernels/layer_ops.hpp) -------------
  // Every backward with `accumulate` adds to its parameter gradients (dw, db,
  // dgamma, dbeta, dtable) instead of overwriting them; input gradients (dx)
  // are always overwritten. Pointers documented "may be null" are skipped.

  // y = conv(x, w) + b (b may be null).
  virtual void conv2d_forward(const conv2d_shape& s, const float* x, const float* w, const float* b,
                              float* y) = 0;
  // dx (may be null: the first layer), dw, db (may be null) from dy.
  virtual void conv2d_backward(const conv2d_shape& s, const float* x, const float* w,
                               const float* dy, float* dx, float* dw, float* db,
                               bool accumulate) = 0;

  // Pooling. Training passes a workspace of pool2d_workspace_bytes(s)
  // bytes (device memory) that the forward fills and the backward reads
  // (max pooling's winners); inference passes null.
  virtual std::size_t pool2d_workspace_bytes(const pool2d_shape& s) = 0;
  virtual void pool2d_forward(const pool2d_shape& s, const float* x, float* y, void* workspace) = 0;
  virtual void pool2d_backward(const pool2d_shape& s, const float* x, const float* dy, float* dx,
                               const void* workspace) = 0;

  // y = f(x) over n elements (alpha: leaky_relu's slope); the backward gets
  // the forward's input and output (each function reads the one it needs)
  // and may write dx over dy.
  virtual void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n) = 0;
  virtual void unary_backward(unary_op op, float alpha, const float* x, const float* y,
                              const float* dy, float* dx, std::size_t n) = 0;

  // Batch normalisation over x[batch, channels, spatial] (spatial = H*W; 1
  // after a dense layer), in steps so that the sums can be all-reduced over
  // replicas in between (synchronised batch norm):
  //   batch_norm_sums:       sums[0,c) = sum of x per channel, sums[c,2c) =
  //                          sum of x^2 (accumulated in double, stored float);
  //   batch_norm_statistics: mean = sum/count, var = max(0, sumsq/count -
  //                          mean^2), invstd = 1/sqrt(var + eps); running
  //                          statistics (may be null) move by `momentum`
  //                          towards mean and the unbiased variance
  //                          (var * count/(count-1)), as PyTorch does;
  //   batch_norm_forward:    y = (x - mean) * invstd * gamma + beta;
  //   batch_norm_backward_sums: sums[0,c) = sum dy, sums[c,2c) = sum dy*xhat
  //                          (xhat = (x - mean) * invstd): the local beta and
  //                          gamma gradients;
  //   batch_norm_backward:   dx = gamma * invstd * (dy - sum_dy/count - xhat *
  //                          sum_dy_xhat/count), the sums over all `count`
  //                          examples' positions (all-reduced when synced).
  // Evaluation uses batch_norm_forward with the running mean and
  // invstd_from_variance(running var).
  virtual void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                               float* sums) = 0;
  virtual void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                                     float momentum, float* mean, float* invstd,
                                     float* running_mean, float* running_var) = 0;
  virtual void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n) = 0;
  virtual void batch_norm_forward(const float* x, const float* mean, const float* invstd,
                                  const float* gamma, const float* beta, float* y, int64_t batch,
                                  int64_t channels, int64_t spatial) = 0;
  virtual void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                                        const float* invstd, int64_t batch, int64_t channels,
                                        int64_t spatial, float* sums) = 0;
  virtual void batch_norm_backward(const float* x, const float* dy, const float* mean,
                                   const float* invstd, const float* gamma, const float* sums,
                                   double count, float* dx, int64_t batch, int64_t channels,
                                   int64_t spatial) = 0;

  // Layer normalisation of each row of x[rows, cols]: y = (x - mean_r) *
  // invstd_r * gamma + beta (gamma, beta: [cols]); the forward saves
  // mean[rows] and invstd[rows] for the backward.
  virtual void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                                  float* mean, float* invstd, int64_t rows, int64_t cols,
                                  float eps) = 0;
  virtual void layer_norm_backward(const float* x, const float* dy, const float* gamma,
                                   const float* mean, const float* invstd, float* dx, float* dgamma,
                                   float* dbeta, int64_t rows, int64_t cols, bool accumulate) = 0;

  // y[r, j] = x[r, j] * keep(seed, ids[r], j) / (1 - rate)
  // (kernels/layer_ops.hpp: dropout_keep); the backward is the same call on
  // dy. ids: one example id per row, in device memory.
  virtual void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate,
                       uint64_t seed, const int64_t* ids) = 0;

  // dropout with the seed of the step in counter[0] (device memory, see
  // gather_planned_rows): kernels/layer_ops.hpp's dropout_step_seed(base,
  // counter[0], layer), the seed a host computes for dropout() at that step.
  virtual void dropout_at_step(const float* x, float* y, int64_t rows, int64_t cols, float rate,
                               uint64_t base, uint64_t layer, const int64_t* counter,
                               const int64_t* ids) = 0;

  // Embedding lookup: ids[rows, len] hold integers in [0, vocab) as floats
  // (the caller checks them on the host), table[vocab, dim]. out[rows, len,
  // dim] = table[ids], or with bag_mean out[rows, dim] = the mean over len.
  virtual void embedding_forward(const float* ids, const float* table, float* out, int64_t rows,
                                 int64_t len, int64_t dim, bool bag_mean) = 0;
  // dtable (+)= the scatter of dy to the rows ids name.
  virtual void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows,
                                  int64_t len, int64_t vocab, int64_t dim, bool bag_mean,
                                  bool accumulate) = 0;

  // Binary cross-entropy on logits[batch, outputs] against targets in [0, 1]
  // (numerically stable: max(z,0) - z*t + log(1 + exp(-|z|))). Per-example
  // loss: the sum over outputs. dlogits = (sigmoid(z) - t) * grad_scale (null:
  // none). ADDS the losses to *loss_sum and, to *correct, the examples whose
  // every output is on the target's side of 0.5.
  virtual void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                                     int64_t outputs, float grad_scale, float* dlogits,
                                     double* loss_sum, int64_t* correct) = 0;
  // Mean squared error: per-example loss = mean over outputs of (p - t)^2;
  // dpred = 2 (p - t) / outputs * grad_scale (null: none); ADDS the losses
  // to *loss_sum.
  virtual void mean_squared_error(const float* pred, const float* targets, int64_t batch,
                                  int64_t outputs, float grad_scale, float* dpred,
                                  double* loss_sum) = 0;

  virtual void fill(float* x, float v, std::size_t n) = 0;
  virtual void fill_stats(double* loss_sum, int64_t* correct) = 0;          // both to 0
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;       // within the device
  virtual void add_inplace(float* acc, const float* x, std::size_t n) = 0;  // acc += x
  virtual void scale_inplace(float* x, float s, std::size_t n) = 0;         // x *= s

  // The optimizer updates of kernels/cpu_kernels.hpp, same semantics.
  virtual void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay) = 0;
  virtual void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                             bool nesterov, float weight_decay) = 0;
  virtual void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr,
                         float b1, float b2, float eps, int64_t step, float weight_decay,
                         bool decoupled) = 0;
  virtual void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                            float eps, float weight_decay) = 0;
  virtual void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay) = 0;

  // ---- steps on device-resident data (models/resident_steps.hpp) ----------
  // What a step reads that changes from one step to the next lives in device
  // memory, so that the same launches (a captured graph) replay every step.
  // `counter` is int64[2] in device memory: [0] the optimizer's 0-based step,
  // [1] the step its execution began at, so k = counter[0] - counter[1] is
  // the step's place in the execution. `plan` (int64, device memory): plan[k]
  // is where step k's row indices begin in `plan` itself.
  //
  // For each of the two sets (b.src may be null): dst[r, :] = src[plan[plan[k]
  // + r], :] for r < rows, rows of `words` 4-byte words (float features,
  // int32 labels, float targets); ids[r] (ids may be null) = that row index.
  // The caller checked the indices. Both sets in one pass (one launch).
  struct row_set {
    const void* src = nullptr;
    int64_t words = 0;
    void* dst = nullptr;
  };
  virtual void gather_planned_rows(row_set a, row_set b, const int64_t* plan,
                                   const int64_t* counter, int64_t rows, int64_t* ids) = 0;
  // A step's end: loss_out[k] = *loss_sum and correct_out[k] = *correct,
  // both sums zeroed for the next step, and the step counted (counter[0] +=
  // 1), in one launch where fills and an increment would be three. After
  // everything else of the step that reads the counter.
  virtual void record_step_stats(double* loss_sum, int64_t* correct, int64_t* counter,
                                 double* loss_out, int64_t* correct_out) = 0;
  // adam_step on every tensor of `t` in one launch (a multi-tensor update:
  // one kernel, not one a variable), with this step's lr, step_size and
  // inv_sqrt_bc2 read from scalars[3 * counter[0] + {0, 1, 2}]
  // (kernels/optimizer.hpp: schedule_table), the same floats adam_step
  // computes on the host.
  virtual void adam_step_scheduled(const adam_tensors& t, const float* scalars,
                                   const int64_t* counter, float b1, float b2, float eps,
                                   float weight_decay, bool decoupled) = 0;
};

// The CPU kernels behind the backend interface (stateless; one per process).
backend& cpu_backend();

}  // namespace troupe::kernels
