#pragma once
// CPU kernels. Every function runs on the calling thread only (a device is one
// thread). Matrices are row-major. The matrix products are oneDNN's
// (kernels/onednn.hpp); everything else is troupe's own loops
// (kernels/vector_kernels.hpp), both at the instruction-set level chosen from
// the CPU's features (kernels/cpu_isa.hpp). Element-wise math lives in
// kernels/elementwise.hpp, shared with the CUDA path.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/activation.hpp"

namespace troupe::kernels {

// Chooses the instruction-set level (throws std::invalid_argument for a bad
// TROUPE_CPU_ISA) and sets up oneDNN. Idempotent; any kernel does it too.
void init_cpu_kernels();

// What runs, for the log's first lines: "oneDNN 2.6.3 avx512_core_bf16,
// loops avx512 (CPU supports avx512)", and with measure, a single-thread
// sgemm rate of the main example's first layer ("sgemm 112 GFLOP/s on 1
// thread"), measured in about 10 ms.
std::string describe_cpu_kernels(bool measure);
// GFLOP/s of y = x[128,784] w[784,256] + b on the calling thread.
double measure_sgemm_gflops(double seconds);

// y[batch,out] = act(x[batch,in] * w[in,out] + b[out])   (b may be null)
void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                   int64_t in, int64_t out, activation act = activation::none);
// Given dy[batch,out]: dw[in,out] = x^T dy, db[out] = sum_rows dy, dx[batch,in] = dy w^T.
// dx and db may be null. When accumulate is true, dw/db are added to, not overwritten.
void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, int64_t batch, int64_t in, int64_t out, bool accumulate = false);

void relu_forward(const float* x, float* y, std::size_t n);
// dx = dy where y > 0, else 0 (y is the forward output).
void relu_backward(const float* y, const float* dy, float* dx, std::size_t n);
void tanh_forward(const float* x, float* y, std::size_t n);
// dx = dy * (1 - y^2) (y is the forward output).
void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n);

// dx[rows,cols] = act'(y) * dy (y: the activation's output; dx may alias dy)
// and db[cols] (+)= column sums of dx (db may be null), in one pass.
void activation_backward_bias(activation act, const float* y, const float* dy, float* dx, float* db,
                              int64_t rows, int64_t cols, bool accumulate);
// db[cols] (+)= column sums of dy[rows,cols].
void column_sums(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate);

// Numerically stable fused softmax + cross-entropy over logits[batch,classes].
// Writes dlogits = (softmax - onehot) * grad_scale (dlogits may alias logits or
// be null). Returns the SUM over the batch of per-example losses; adds the
// number of correct argmax predictions to *correct when non-null.
// Labels outside [0, classes) throw std::out_of_range.
double softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                             int64_t classes, float grad_scale, float* dlogits, int64_t* correct);

// Reductions over n floats (accumulated in double for sum/mean).
double reduce_sum(const float* x, std::size_t n);
double reduce_mean(const float* x, std::size_t n);
float reduce_min(const float* x, std::size_t n);  // n must be > 0
float reduce_max(const float* x, std::size_t n);  // n must be > 0

// Element-wise, in place, for reducers and gradient accumulation.
void add_inplace(float* acc, const float* x, std::size_t n);  // acc += x
void scale_inplace(float* x, float s, std::size_t n);         // x *= s
void min_inplace(float* acc, const float* x, std::size_t n);  // acc = min(acc, x)
void max_inplace(float* acc, const float* x, std::size_t n);  // acc = max(acc, x)
void fill(float* x, float v, std::size_t n);
// dst = (src[0] + ... + src[m-1]) * scale, in source order per element; dst
// may be one of the sources (the in-process collectives' reduction).
// out[i] = table[src[i]] for n bytes (table: 256 floats).
void decode_bytes(const uint8_t* src, const float* table, float* out, std::size_t n);
void sum_sources(float* dst, const float* const* src, std::size_t m, std::size_t n, float scale);

// Optimizer steps on one variable of n elements, in place. `step` is the
// 1-based update count (Adam's bias correction). weight_decay: L2 added to the
// gradient (g + wd*w), unless decoupled (w -= lr*wd*w, AdamW).
void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay);
// v = mu*v + g; w -= lr*v   (nesterov: w -= lr*(g + mu*v))
void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                   bool nesterov, float weight_decay);
// m = b1*m + (1-b1)g; v = b2*v + (1-b2)g^2; w -= lr * mhat / (sqrt(vhat) + eps)
void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
               float b2, float eps, int64_t step, float weight_decay, bool decoupled);
// ms = rho*ms + (1-rho)g^2; w -= lr * g / (sqrt(ms) + eps)
void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                  float eps, float weight_decay);
// adam_step with the step's scalars given (ew::adam_scalars_for's, computed
// once per step for every variable; see backend::adam_step_scheduled).
void adam_step_with(float* w, float* m, float* v, const float* g, std::size_t n, float lr,
                    float step_size, float inv_sqrt_bc2, float b1, float b2, float eps,
                    float weight_decay, bool decoupled);

// Decoupled weight decay alone: w -= lr*wd*w (used by the optimizer for
// decoupled decay with sgd/momentum/rmsprop; adam_step does it itself).
void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay);

}  // namespace troupe::kernels
