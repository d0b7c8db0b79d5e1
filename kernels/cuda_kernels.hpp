#pragma once
// CUDA path (built only when TROUPE_HAVE_CUDA): host launch wrappers taking
// DEVICE pointers and a stream. The element-wise math is the same code as the
// CPU kernels (kernels/elementwise.hpp). Launches are asynchronous on
// `stream`; a launch error throws std::runtime_error.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/backend.hpp"

namespace troupe::kernels::cuda {

void relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream);
void relu_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream);
void tanh_forward(const float* x, float* y, std::size_t n, cudaStream_t stream);
void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream);

void fill(float* x, float v, std::size_t n, cudaStream_t stream);                  // x[i] = v
void add_inplace(float* acc, const float* x, std::size_t n, cudaStream_t stream);  // acc += x
void scale_inplace(float* x, float s, std::size_t n, cudaStream_t stream);         // x *= s

// Row-major helpers of the dense layers (the products are cuBLAS's):
// y[r,j] = b[j] for every row r < rows (the bias a GEMM then adds to);
void broadcast_rows(const float* b, float* y, int64_t rows, int64_t cols, cudaStream_t stream);
// db[j] = sum over r of dy[r,j], added to db when accumulate (rows may be 0).
// The scratch of the column sums' blocks over runs of rows: partial_floats
// floats, and arrival_slots counters that start at 0 (and are left at 0).
// Null partials: one block a column tile. One scratch a stream.
struct column_sum_scratch {
  float* partials = nullptr;
  std::size_t partial_floats = 0;
  unsigned* arrivals = nullptr;
  std::size_t arrival_slots = 0;
};
// The runs of rows the column sums take (a fixed function of the shape and
// the scratch's size, so their rounding is the same at every call).
int64_t column_sum_runs(int64_t rows, int64_t cols, const column_sum_scratch& scratch);
void column_sums(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate,
                 const column_sum_scratch& scratch, cudaStream_t stream);
// One pass for an activation's backward and its layer's bias gradient:
// dx = act'(y) * dy (y: the activation's output; dx may alias dy, or be null
// when only db is wanted) and db (+)= the column sums of dx.
void activation_backward_column_sums(activation act, const float* y, const float* dy, float* dx,
                                     float* db, int64_t rows, int64_t cols, bool accumulate,
                                     const column_sum_scratch& scratch, cudaStream_t stream);

// Fused softmax + cross-entropy, kernels/cpu_kernels.hpp's semantics on
// device memory, one warp per row: dlogits (may alias logits, or be null) =
// (softmax - onehot) * grad_scale; ADDS the rows' loss sum to *loss_sum and
// the number of rows whose argmax (first maximum, as on the CPU) is the label
// to *correct (either may be null). Labels must be in [0, classes) (checked
// by the caller: a row with a label outside adds NaN to the loss and writes
// no gradient). The loss is added with one atomic per block, so its last bits
// may vary from run to run; the count and dlogits do not.
void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                           int64_t classes, float grad_scale, float* dlogits, double* loss_sum,
                           int64_t* correct, cudaStream_t stream);

// Same semantics as the CPU versions in kernels/cpu_kernels.hpp.
void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay,
              cudaStream_t stream);
void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                   bool nesterov, float weight_decay, cudaStream_t stream);
// step is the 1-based update count (bias correction computed on the host).
void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
               float b2, float eps, int64_t step, float weight_decay, bool decoupled,
               cudaStream_t stream);
void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                  float eps, float weight_decay, cudaStream_t stream);
void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay,
                          cudaStream_t stream);

// Steps on device-resident data (backend.hpp: gather_planned_rows and after).
struct planned_set {
  const void* src;
  int64_t words;
  void* dst;
};
void gather_planned_rows(planned_set a, planned_set b, const int64_t* plan, const int64_t* counter,
                         int64_t rows, int64_t* ids, cudaStream_t stream);
void record_step_stats(double* loss_sum, int64_t* correct, int64_t* counter, double* loss_out,
                       int64_t* correct_out, cudaStream_t stream);
void adam_step_scheduled(const adam_tensors& t, const float* scalars, const int64_t* counter,
                         float b1, float b2, float eps, float weight_decay, bool decoupled,
                         cudaStream_t stream);

}  // namespace troupe::kernels::cuda
