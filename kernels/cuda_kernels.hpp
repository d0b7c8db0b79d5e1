#pragma once
// CUDA path (built only when TROUPE_HAVE_CUDA): host launch wrappers taking
// DEVICE pointers and a stream. The element-wise math is the same code as the
// CPU kernels (kernels/elementwise.hpp). Launches are asynchronous on
// `stream`; a launch error throws std::runtime_error.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace troupe::kernels::cuda {

void relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream);
void relu_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream);
void tanh_forward(const float* x, float* y, std::size_t n, cudaStream_t stream);
void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream);

void add_inplace(float* acc, const float* x, std::size_t n, cudaStream_t stream);  // acc += x
void scale_inplace(float* x, float s, std::size_t n, cudaStream_t stream);         // x *= s

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

}  // namespace troupe::kernels::cuda
