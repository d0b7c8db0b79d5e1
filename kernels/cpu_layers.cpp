#include "kernels/cpu_layers.hpp"

#include <stdexcept>

#pragma GCC diagnostic ignored "-Wunused-parameter"  // stubs until the kernels land

namespace troupe::kernels::cpu {

void conv2d_forward(const conv2d_shape& s, const float* x, const float* w, const float* b,
                    float* y) {
  throw std::logic_error("cpu conv2d_forward: not implemented yet");
}

void conv2d_backward(const conv2d_shape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, bool accumulate) {
  throw std::logic_error("cpu conv2d_backward: not implemented yet");
}

std::size_t pool2d_workspace_bytes(const pool2d_shape& s) {
  throw std::logic_error("cpu pool2d_workspace_bytes: not implemented yet");
}

void pool2d_forward(const pool2d_shape& s, const float* x, float* y, void* workspace) {
  throw std::logic_error("cpu pool2d_forward: not implemented yet");
}

void pool2d_backward(const pool2d_shape& s, const float* x, const float* dy, float* dx,
                     const void* workspace) {
  throw std::logic_error("cpu pool2d_backward: not implemented yet");
}

void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n) {
  throw std::logic_error("cpu unary_forward: not implemented yet");
}

void unary_backward(unary_op op, float alpha, const float* x, const float* y, const float* dy,
                    float* dx, std::size_t n) {
  throw std::logic_error("cpu unary_backward: not implemented yet");
}

void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                     float* sums) {
  throw std::logic_error("cpu batch_norm_sums: not implemented yet");
}

void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                           float momentum, float* mean, float* invstd, float* running_mean,
                           float* running_var) {
  throw std::logic_error("cpu batch_norm_statistics: not implemented yet");
}

void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n) {
  throw std::logic_error("cpu invstd_from_variance: not implemented yet");
}

void batch_norm_forward(const float* x, const float* mean, const float* invstd, const float* gamma,
                        const float* beta, float* y, int64_t batch, int64_t channels,
                        int64_t spatial) {
  throw std::logic_error("cpu batch_norm_forward: not implemented yet");
}

void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                              const float* invstd, int64_t batch, int64_t channels, int64_t spatial,
                              float* sums) {
  throw std::logic_error("cpu batch_norm_backward_sums: not implemented yet");
}

void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                         const float* gamma, const float* sums, double count, float* dx,
                         int64_t batch, int64_t channels, int64_t spatial) {
  throw std::logic_error("cpu batch_norm_backward: not implemented yet");
}

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* invstd, int64_t rows, int64_t cols, float eps) {
  throw std::logic_error("cpu layer_norm_forward: not implemented yet");
}

void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                         const float* invstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                         int64_t cols, bool accumulate) {
  throw std::logic_error("cpu layer_norm_backward: not implemented yet");
}

void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
             const int64_t* ids) {
  throw std::logic_error("cpu dropout: not implemented yet");
}

void embedding_forward(const float* ids, const float* table, float* out, int64_t rows, int64_t len,
                       int64_t dim, bool bag_mean) {
  throw std::logic_error("cpu embedding_forward: not implemented yet");
}

void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t len,
                        int64_t vocab, int64_t dim, bool bag_mean, bool accumulate) {
  throw std::logic_error("cpu embedding_backward: not implemented yet");
}

void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                           int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                           int64_t* correct) {
  throw std::logic_error("cpu sigmoid_cross_entropy: not implemented yet");
}

void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                        float grad_scale, float* dpred, double* loss_sum) {
  throw std::logic_error("cpu mean_squared_error: not implemented yet");
}

}  // namespace troupe::kernels::cpu
