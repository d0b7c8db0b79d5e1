#pragma once
// The one place that owns oneDNN: its CPU engine (one per process, its ISA
// capped at active_isa(), kernels/cpu_isa.hpp), a stream and a cache of
// matmul primitives per calling thread (each device is one thread; a
// primitive is made once per shape and reused every step), and the thread
// count: oneDNN's OpenMP team is limited to the calling thread, so two device
// threads on two cores never start four.
//
// Matrices are row-major float32. The layer primitives (convolution and
// pooling, kernels/cpu_conv_pool.cpp) use the same engine and per-thread stream
// (kernels/onednn_internal.hpp) and keep their own per-thread cache.
#include <cstdint>
#include <string>

#include "kernels/vector_kernels.hpp"

namespace troupe::kernels::onednn {

// y[m,n] = act(x[m,k] * w[k,n] + b[n]) (b may be null); bias and activation
// fused into the product as oneDNN post-ops.
void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                   int64_t n, activation act);
// dw[k,n] (+)= x[m,k]^T dy[m,n]
void weight_gradient(const float* x, const float* dy, float* dw, int64_t m, int64_t k, int64_t n,
                     bool accumulate);
// dx[m,k] = dy[m,n] w[k,n]^T
void input_gradient(const float* dy, const float* w, float* dx, int64_t m, int64_t k, int64_t n);

// The ISA oneDNN dispatches to ("avx512_core_bf16", ...) and its version.
std::string effective_isa();
std::string version();

// Primitives cached on the calling thread (tests).
std::size_t cached_primitives();

}  // namespace troupe::kernels::onednn
