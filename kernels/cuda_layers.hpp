#pragma once
// CUDA path of the layer operations (built only when TROUPE_HAVE_CUDA): host
// launch wrappers taking DEVICE pointers and a stream, with the semantics of
// kernels/backend.hpp's "layers" section. The convolutions are cuDNN's
// (kernels/cuda_backend_conv.cu); these are the rest, plus the zero padding
// that lets cuDNN's symmetric-padding convolution take asymmetric padding:
// kernels/cuda_row_layers.cu (over rows: activations, layer norm, dropout,
// embeddings, losses) and kernels/cuda_conv_layers.cu (over NCHW planes:
// padding, pooling, the convolution's bias, batch norm).
// Launches are asynchronous on `stream`; a launch error throws
// std::runtime_error naming the operation.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/layer_ops.hpp"

namespace troupe::kernels::cuda {

// xp[p, top + h, left + w] = x[p, h, w] over planes p < planes; every other
// element of xp[planes, hp, wp] is 0.
void pad_planes(const float* x, float* xp, int64_t planes, int64_t h, int64_t w, int64_t hp,
                int64_t wp, int64_t top, int64_t left, cudaStream_t stream);
// The inverse view: x[p, h, w] = xp[p, top + h, left + w].
void crop_planes(const float* xp, float* x, int64_t planes, int64_t h, int64_t w, int64_t hp,
                 int64_t wp, int64_t top, int64_t left, cudaStream_t stream);

// Pooling with kernels/layer_ops.hpp's rules (asymmetric padding, padding
// never wins a max, the first largest takes the gradient, the average over
// the positions inside the image). argmax: one int32 per output (the
// winner's index within its input plane, -1 for a window with no input), or
// null; max pooling's backward needs it.
void pool2d_forward(const pool2d_shape& s, const float* x, float* y, int32_t* argmax,
                    cudaStream_t stream);
// dx is overwritten; each input gathers from the windows covering it (no
// atomics: deterministic).
void pool2d_backward(const pool2d_shape& s, const float* dy, float* dx, const int32_t* argmax,
                     cudaStream_t stream);

void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n,
                   cudaStream_t stream);
void unary_backward(unary_op op, float alpha, const float* x, const float* y, const float* dy,
                    float* dx, std::size_t n, cudaStream_t stream);

// The batch-norm steps of kernels/backend.hpp. The per-channel sums run as
// batch_norm_splits() blocks a channel, each accumulating in double in a
// fixed order into `partials` (2 * channels * splits doubles, the caller's
// scratch), then added up in order.
int64_t batch_norm_splits(int64_t batch, int64_t channels, int64_t spatial);
// The blocks the per-channel sums aim at: channels * splits is at most this
// plus channels - 1 (what sizes the partials' scratch).
constexpr int64_t channel_sum_blocks = 1056;
// A convolution's bias: y[n, c, p] += b[c]; its gradient db[c] (+)= the sum
// of dy[n, c, p] over n and p, as the batch-norm sums (partials likewise).
void add_channel_bias(float* y, const float* b, int64_t batch, int64_t channels, int64_t spatial,
                      cudaStream_t stream);
void channel_bias_gradient(const float* dy, int64_t batch, int64_t channels, int64_t spatial,
                           float* db, bool accumulate, double* partials, cudaStream_t stream);
void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial, float* sums,
                     double* partials, cudaStream_t stream);
void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                           float momentum, float* mean, float* invstd, float* running_mean,
                           float* running_var, cudaStream_t stream);
void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n,
                          cudaStream_t stream);
void batch_norm_forward(const float* x, const float* mean, const float* invstd, const float* gamma,
                        const float* beta, float* y, int64_t batch, int64_t channels,
                        int64_t spatial, cudaStream_t stream);
void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                              const float* invstd, int64_t batch, int64_t channels, int64_t spatial,
                              float* sums, double* partials, cudaStream_t stream);
void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                         const float* gamma, const float* sums, double count, float* dx,
                         int64_t batch, int64_t channels, int64_t spatial, cudaStream_t stream);

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* invstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream);
void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                         const float* invstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                         int64_t cols, bool accumulate, cudaStream_t stream);

// counter non-null: seed is the base of dropout_step_seed(seed, counter[0],
// layer), read on the device (backend::dropout_at_step).
void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
             const int64_t* ids, cudaStream_t stream, const int64_t* counter = nullptr,
             uint64_t layer = 0);

void embedding_forward(const float* ids, const float* table, float* out, int64_t rows, int64_t len,
                       int64_t dim, bool bag_mean, cudaStream_t stream);
// atomicAdd scatter: the order of the additions to a row that several ids
// name varies from run to run (so may its last bits).
void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t len,
                        int64_t vocab, int64_t dim, bool bag_mean, bool accumulate,
                        cudaStream_t stream);

// The losses: one warp per example, the loss added in double with one atomic
// per block (its last bits may vary from run to run; the gradients and the
// count do not).
void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                           int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                           int64_t* correct, cudaStream_t stream);
void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                        float grad_scale, float* dpred, double* loss_sum, cudaStream_t stream);

}  // namespace troupe::kernels::cuda
