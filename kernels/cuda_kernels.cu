#include "kernels/cuda_kernels.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/elementwise.hpp"

namespace troupe::kernels::cuda {

namespace {

constexpr unsigned threads_per_block = 256;
constexpr std::size_t max_blocks = 4096;  // grid-stride loops cover the rest

unsigned blocks_for(std::size_t n) {
  std::size_t b = (n + threads_per_block - 1) / threads_per_block;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cuda ") + what + ": " + cudaGetErrorString(e));
}

// Grid-stride loop: each thread handles i, i + stride, ...
#define TROUPE_GRID_LOOP(i, n)                                                                   \
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) y[i] = ew::relu(x[i]);
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) dx[i] = ew::relu_grad(y[i], dy[i]);
}

__global__ void tanh_forward_kernel(const float* x, float* y, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) y[i] = ew::tanh_act(x[i]);
}

__global__ void tanh_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) dx[i] = ew::tanh_grad(y[i], dy[i]);
}

__global__ void add_kernel(float* acc, const float* x, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) acc[i] += x[i];
}

__global__ void scale_kernel(float* x, float s, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) x[i] *= s;
}

__global__ void sgd_kernel(float* w, const float* g, std::size_t n, float lr, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::sgd_update(w[i], g[i], lr, wd);
}

__global__ void momentum_kernel(float* w, float* v, const float* g, std::size_t n, float lr,
                                float mu, bool nesterov, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::momentum_update(w[i], v[i], g[i], lr, mu, nesterov, wd);
}

__global__ void adam_kernel(float* w, float* m, float* v, const float* g, std::size_t n, float lr,
                            float b1, float b2, float eps, float bc1, float bc2, float wd,
                            bool decoupled) {
  TROUPE_GRID_LOOP(i, n)
  ew::adam_update(w[i], m[i], v[i], g[i], lr, b1, b2, eps, bc1, bc2, wd, decoupled);
}

__global__ void rmsprop_kernel(float* w, float* ms, const float* g, std::size_t n, float lr,
                               float rho, float eps, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::rmsprop_update(w[i], ms[i], g[i], lr, rho, eps, wd);
}

__global__ void decay_kernel(float* w, std::size_t n, float lr, float wd) {
  TROUPE_GRID_LOOP(i, n) ew::decoupled_decay(w[i], lr, wd);
}

#undef TROUPE_GRID_LOOP

}  // namespace

void relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_forward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, y, n);
  check_launch("relu_forward");
}

void relu_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(y, dy, dx, n);
  check_launch("relu_backward");
}

void tanh_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  tanh_forward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, y, n);
  check_launch("tanh_forward");
}

void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  tanh_backward_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(y, dy, dx, n);
  check_launch("tanh_backward");
}

void add_inplace(float* acc, const float* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(acc, x, n);
  check_launch("add_inplace");
}

void scale_inplace(float* x, float s, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, s, n);
  check_launch("scale_inplace");
}

void sgd_step(float* w, const float* g, std::size_t n, float lr, float weight_decay,
              cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, g, n, lr, weight_decay);
  check_launch("sgd_step");
}

void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                   bool nesterov, float weight_decay, cudaStream_t stream) {
  if (n == 0) return;
  momentum_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, v, g, n, lr, mu, nesterov,
                                                                   weight_decay);
  check_launch("momentum_step");
}

void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
               float b2, float eps, int64_t step, float weight_decay, bool decoupled,
               cudaStream_t stream) {
  if (step < 1)
    throw std::invalid_argument("cuda adam_step: step must be >= 1 (1-based), got " +
                                std::to_string(step));
  if (n == 0) return;
  const double t = static_cast<double>(step);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
  adam_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, m, v, g, n, lr, b1, b2, eps, bc1,
                                                               bc2, weight_decay, decoupled);
  check_launch("adam_step");
}

void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                  float eps, float weight_decay, cudaStream_t stream) {
  if (n == 0) return;
  rmsprop_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, ms, g, n, lr, rho, eps,
                                                                  weight_decay);
  check_launch("rmsprop_step");
}

void decoupled_decay_step(float* w, std::size_t n, float lr, float weight_decay,
                          cudaStream_t stream) {
  if (n == 0) return;
  decay_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(w, n, lr, weight_decay);
  check_launch("decoupled_decay_step");
}

}  // namespace troupe::kernels::cuda
