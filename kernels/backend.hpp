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

#include "kernels/activation.hpp"

namespace troupe::kernels {

class backend {
 public:
  virtual ~backend() = default;
  virtual const char* name() const = 0;

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
};

// The CPU kernels behind the backend interface (stateless; one per process).
backend& cpu_backend();

}  // namespace troupe::kernels
