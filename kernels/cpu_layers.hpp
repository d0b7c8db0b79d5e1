#pragma once
// The CPU implementations of the layer operations of kernels/backend.hpp
// (semantics there and in kernels/layer_ops.hpp); cpu_backend() calls these.
// Convolution and pooling are oneDNN primitives, cached per shape on the
// calling thread (kernels/onednn.hpp); the rest are loops over host memory.
#include <cstddef>
#include <cstdint>

#include "kernels/layer_ops.hpp"

namespace troupe::kernels::cpu {

void conv2d_forward(const conv2d_shape& s, const float* x, const float* w, const float* b,
                    float* y);
void conv2d_backward(const conv2d_shape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, bool accumulate);
std::size_t pool2d_workspace_bytes(const pool2d_shape& s);
void pool2d_forward(const pool2d_shape& s, const float* x, float* y, void* workspace);
void pool2d_backward(const pool2d_shape& s, const float* x, const float* dy, float* dx,
                     const void* workspace);
void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n);
void unary_backward(unary_op op, float alpha, const float* x, const float* y, const float* dy,
                    float* dx, std::size_t n);
void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial, float* sums);
void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                           float momentum, float* mean, float* invstd, float* running_mean,
                           float* running_var);
void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n);
void batch_norm_forward(const float* x, const float* mean, const float* invstd, const float* gamma,
                        const float* beta, float* y, int64_t batch, int64_t channels,
                        int64_t spatial);
void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                              const float* invstd, int64_t batch, int64_t channels, int64_t spatial,
                              float* sums);
void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                         const float* gamma, const float* sums, double count, float* dx,
                         int64_t batch, int64_t channels, int64_t spatial);
void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* invstd, int64_t rows, int64_t cols, float eps);
void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                         const float* invstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                         int64_t cols, bool accumulate);
void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
             const int64_t* ids);
void embedding_forward(const float* ids, const float* table, float* out, int64_t rows, int64_t len,
                       int64_t dim, bool bag_mean);
void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t len,
                        int64_t vocab, int64_t dim, bool bag_mean, bool accumulate);
void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                           int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                           int64_t* correct);
void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                        float grad_scale, float* dpred, double* loss_sum);

// Convolution and pooling shapes with primitives cached on the calling
// thread (tests: a repeated call creates nothing).
std::size_t cached_layer_shapes();

}  // namespace troupe::kernels::cpu
