#pragma once
// The CUDA backend's class (kernels/cuda_backend.hpp), shared by the two
// files that define it: kernels/cuda_backend.cu (the handles, the scratch
// memory, the cuBLAS and cuBLASLt dense layers) and kernels/cuda_backend_conv.cu
// (the cuDNN convolutions: descriptors, algorithm choice and fallback). The
// one-line forwards to the kernels of kernels/cuda_kernels.cu and
// kernels/cuda_*_layers.cu are defined here, in the class. Not for use
// outside kernels/.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cuda_kernels.hpp"
#include "kernels/cuda_layers.hpp"

namespace troupe::kernels::cuda_backend_detail {

// Each throws std::runtime_error "cuda <op>: <call>: <error>" (clearing the
// error, so that a later launch check does not report it again).
[[noreturn]] void fail(const char* op, const std::string& what);
void check_cuda(cudaError_t e, const char* op, const char* call);
void check_cublas(cublasStatus_t s, const char* op, const char* call);
void check_cudnn(cudnnStatus_t s, const char* op, const char* call);

// cuBLAS takes int dimensions; refuse what does not fit instead of truncating.
inline int gemm_dim(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > static_cast<int64_t>(std::numeric_limits<int>::max()))
    fail(op, std::string("dimension ") + what + " = " + std::to_string(v) + " out of range");
  return static_cast<int>(v);
}

inline std::size_t elems(int64_t a, int64_t b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

// One direction's algorithm: the ranking, the one in use and its workspace.
template <class Algo>
struct algo_choice {
  bool ready = false;
  std::vector<Algo> ranked;
  std::size_t at = 0;
  std::size_t ws = 0;
  Algo algo() const { return ranked[at]; }
};

// The cuDNN descriptors of one convolution shape and the algorithms chosen
// for it (each direction on first use). cuDNN pads symmetrically; an
// asymmetric padding is cuDNN's min(top, bottom) x min(left, right) on a
// copy of x with the rest of the padding written as zeros (hp x wp planes).
struct conv_plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  bool padded = false;
  int64_t hp = 0, wp = 0, extra_top = 0, extra_left = 0;
  std::size_t padded_bytes = 0;
  algo_choice<cudnnConvolutionFwdAlgo_t> fwd;
  algo_choice<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  algo_choice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;

  conv_plan() = default;
  conv_plan(const conv_plan&) = delete;
  conv_plan& operator=(const conv_plan&) = delete;
  ~conv_plan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

// Device memory the backend keeps between calls, grown on demand.
struct scratch_buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
};

using conv_key = std::array<int64_t, 16>;

// A dense layer's forward as one cuBLASLt matmul whose epilogue adds the
// bias and applies ReLU (three launches otherwise: the bias broadcast, the
// GEMM, the activation): its descriptors and the heuristic's algorithm, per
// shape. FP32 compute, no TF32, as the cuBLAS path.
struct lt_plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
  lt_plan() = default;
  lt_plan(const lt_plan&) = delete;
  lt_plan& operator=(const lt_plan&) = delete;
  ~lt_plan() {
    for (auto* l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};
using lt_key = std::array<int64_t, 4>;  // batch, in, out, relu
inline constexpr std::size_t kLtWorkspace = 4 << 20;

class cuda_backend_impl final : public backend {
 public:
  explicit cuda_backend_impl(cudaStream_t stream);
  ~cuda_backend_impl() override;
  cuda_backend_impl(const cuda_backend_impl&) = delete;
  cuda_backend_impl& operator=(const cuda_backend_impl&) = delete;

  const char* name() const override { return "cuda"; }

  void use_tf32(tf32_use u) override;

  // kernels/cuda_backend.cu: the dense layers on cuBLAS and cuBLASLt.
  void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                     int64_t in, int64_t out, activation act) override;
  void activation_backward_bias(activation act, const float* y, const float* dy, float* dx,
                                float* db, int64_t rows, int64_t cols, bool accumulate) override;
  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int64_t batch, int64_t in, int64_t out, bool accumulate) override;

  void relu_forward(const float* x, float* y, std::size_t n) override {
    cuda::relu_forward(x, y, n, stream_);
  }
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    cuda::relu_backward(y, dy, dx, n, stream_);
  }
  void tanh_forward(const float* x, float* y, std::size_t n) override {
    cuda::tanh_forward(x, y, n, stream_);
  }
  void tanh_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    cuda::tanh_backward(y, dy, dx, n, stream_);
  }
  void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t batch,
                             int64_t classes, float grad_scale, float* dlogits, double* loss_sum,
                             int64_t* correct) override {
    cuda::softmax_cross_entropy(logits, labels, batch, classes, grad_scale, dlogits, loss_sum,
                                correct, stream_);
  }

  // ---- layers: the convolutions on cuDNN (kernels/cuda_backend_conv.cu), the
  // rest kernels/cuda_row_layers.cu and kernels/cuda_conv_layers.cu

  void conv2d_forward(const conv2d_shape& s, const float* x, const float* w, const float* b,
                      float* y) override;
  void conv2d_backward(const conv2d_shape& s, const float* x, const float* w, const float* dy,
                       float* dx, float* dw, float* db, bool accumulate) override;

  // Max pooling keeps each output's winner (an int32 index in its input
  // plane) for the backward; average pooling needs nothing.
  std::size_t pool2d_workspace_bytes(const pool2d_shape& s) override {
    if (s.kind != pool_kind::max || s.batch <= 0 || s.channels <= 0 || s.out_h() <= 0 ||
        s.out_w() <= 0)
      return 0;
    return elems(s.batch * s.channels, s.out_h() * s.out_w()) * sizeof(int32_t);
  }
  void pool2d_forward(const pool2d_shape& s, const float* x, float* y, void* workspace) override {
    cuda::pool2d_forward(s, x, y, static_cast<int32_t*>(workspace), stream_);
  }
  void pool2d_backward(const pool2d_shape& s, const float* /*x*/, const float* dy, float* dx,
                       const void* workspace) override {
    cuda::pool2d_backward(s, dy, dx, static_cast<const int32_t*>(workspace), stream_);
  }

  void unary_forward(unary_op op, float alpha, const float* x, float* y, std::size_t n) override {
    cuda::unary_forward(op, alpha, x, y, n, stream_);
  }
  void unary_backward(unary_op op, float alpha, const float* x, const float* y, const float* dy,
                      float* dx, std::size_t n) override {
    cuda::unary_backward(op, alpha, x, y, dy, dx, n, stream_);
  }

  void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial,
                       float* sums) override {
    cuda::batch_norm_sums(x, batch, channels, spatial, sums,
                          bn_partials(batch, channels, spatial, "batch_norm_sums"), stream_);
  }
  void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                             float momentum, float* mean, float* invstd, float* running_mean,
                             float* running_var) override {
    cuda::batch_norm_statistics(sums, channels, count, eps, momentum, mean, invstd, running_mean,
                                running_var, stream_);
  }
  void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n) override {
    cuda::invstd_from_variance(var, eps, invstd, n, stream_);
  }
  void batch_norm_forward(const float* x, const float* mean, const float* invstd,
                          const float* gamma, const float* beta, float* y, int64_t batch,
                          int64_t channels, int64_t spatial) override {
    cuda::batch_norm_forward(x, mean, invstd, gamma, beta, y, batch, channels, spatial, stream_);
  }
  void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                                const float* invstd, int64_t batch, int64_t channels,
                                int64_t spatial, float* sums) override {
    cuda::batch_norm_backward_sums(
        x, dy, mean, invstd, batch, channels, spatial, sums,
        bn_partials(batch, channels, spatial, "batch_norm_backward_sums"), stream_);
  }
  void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                           const float* gamma, const float* sums, double count, float* dx,
                           int64_t batch, int64_t channels, int64_t spatial) override {
    cuda::batch_norm_backward(x, dy, mean, invstd, gamma, sums, count, dx, batch, channels, spatial,
                              stream_);
  }

  void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                          float* mean, float* invstd, int64_t rows, int64_t cols,
                          float eps) override {
    cuda::layer_norm_forward(x, gamma, beta, y, mean, invstd, rows, cols, eps, stream_);
  }
  void layer_norm_backward(const float* x, const float* dy, const float* gamma, const float* mean,
                           const float* invstd, float* dx, float* dgamma, float* dbeta,
                           int64_t rows, int64_t cols, bool accumulate) override {
    cuda::layer_norm_backward(x, dy, gamma, mean, invstd, dx, dgamma, dbeta, rows, cols, accumulate,
                              stream_);
  }

  void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
               const int64_t* ids) override {
    cuda::dropout(x, y, rows, cols, rate, seed, ids, stream_);
  }
  void dropout_at_step(const float* x, float* y, int64_t rows, int64_t cols, float rate,
                       uint64_t base, uint64_t layer, const int64_t* counter,
                       const int64_t* ids) override {
    cuda::dropout(x, y, rows, cols, rate, base, ids, stream_, counter, layer);
  }

  void embedding_forward(const float* ids, const float* table, float* out, int64_t rows,
                         int64_t len, int64_t dim, bool bag_mean) override {
    cuda::embedding_forward(ids, table, out, rows, len, dim, bag_mean, stream_);
  }
  void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows,
                          int64_t len, int64_t vocab, int64_t dim, bool bag_mean,
                          bool accumulate) override {
    cuda::embedding_backward(ids, dy, dtable, rows, len, vocab, dim, bag_mean, accumulate, stream_);
  }

  void sigmoid_cross_entropy(const float* logits, const float* targets, int64_t batch,
                             int64_t outputs, float grad_scale, float* dlogits, double* loss_sum,
                             int64_t* correct) override {
    cuda::sigmoid_cross_entropy(logits, targets, batch, outputs, grad_scale, dlogits, loss_sum,
                                correct, stream_);
  }
  void mean_squared_error(const float* pred, const float* targets, int64_t batch, int64_t outputs,
                          float grad_scale, float* dpred, double* loss_sum) override {
    cuda::mean_squared_error(pred, targets, batch, outputs, grad_scale, dpred, loss_sum, stream_);
  }
  void fill(float* x, float v, std::size_t n) override { cuda::fill(x, v, n, stream_); }
  void fill_stats(double* loss_sum, int64_t* correct) override;
  void copy(float* dst, const float* src, std::size_t n) override;
  void add_inplace(float* acc, const float* x, std::size_t n) override {
    cuda::add_inplace(acc, x, n, stream_);
  }
  void scale_inplace(float* x, float s, std::size_t n) override {
    cuda::scale_inplace(x, s, n, stream_);
  }

  void sgd_step(float* w, const float* g, std::size_t n, float lr, float wd) override {
    cuda::sgd_step(w, g, n, lr, wd, stream_);
  }
  void momentum_step(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                     bool nesterov, float wd) override {
    cuda::momentum_step(w, v, g, n, lr, mu, nesterov, wd, stream_);
  }
  void adam_step(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
                 float b2, float eps, int64_t step, float wd, bool decoupled) override {
    cuda::adam_step(w, m, v, g, n, lr, b1, b2, eps, step, wd, decoupled, stream_);
  }
  void rmsprop_step(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                    float eps, float wd) override {
    cuda::rmsprop_step(w, ms, g, n, lr, rho, eps, wd, stream_);
  }
  void decoupled_decay_step(float* w, std::size_t n, float lr, float wd) override {
    cuda::decoupled_decay_step(w, n, lr, wd, stream_);
  }

  void gather_planned_rows(row_set a, row_set b, const int64_t* plan, const int64_t* counter,
                           int64_t rows, int64_t* ids) override {
    cuda::gather_planned_rows({a.src, a.words, a.dst}, {b.src, b.words, b.dst}, plan, counter, rows,
                              ids, stream_);
  }
  void record_step_stats(double* loss_sum, int64_t* correct, int64_t* counter, double* loss_out,
                         int64_t* correct_out) override {
    cuda::record_step_stats(loss_sum, correct, counter, loss_out, correct_out, stream_);
  }
  void adam_step_scheduled(const adam_tensors& t, const float* scalars, const int64_t* counter,
                           float b1, float b2, float eps, float wd, bool decoupled) override {
    cuda::adam_step_scheduled(t, scalars, counter, b1, b2, eps, wd, decoupled, stream_);
  }

 private:
  // kernels/cuda_backend.cu: the fused dense forward and the scratch memory.
  bool fused_dense(const float* x, const float* w, const float* b, float* y, int64_t batch,
                   int64_t in, int64_t out, activation act);
  std::unique_ptr<lt_plan> make_lt_plan(const lt_key& k);
  cuda::column_sum_scratch column_scratch(const char* op);
  double* bn_partials(int64_t batch, int64_t channels, int64_t spatial, const char* op);
  char* grow(scratch_buffer& b, std::size_t bytes, const char* op, const char* what);

  // kernels/cuda_backend_conv.cu: the cuDNN handle, the plans, the algorithms.
  void ensure_cudnn(const char* op);
  conv_plan& plan(const conv2d_shape& s, const char* op);
  void choose_forward(conv_plan& p, const char* op);
  void choose_backward_data(conv_plan& p, const char* op);
  void choose_backward_filter(conv_plan& p, const char* op);
  template <class Algo, class WorkspaceOf, class Run>
  void run_conv(algo_choice<Algo>& c, const char* op, const char* call, WorkspaceOf workspace_of,
                Run run);

  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  tf32_use tf32_;
  std::map<lt_key, std::unique_ptr<lt_plan>> lt_plans_;
  scratch_buffer lt_ws_;
  cudnnHandle_t dnn_ = nullptr;
  std::map<conv_key, std::unique_ptr<conv_plan>> plans_;
  scratch_buffer pad_;          // the zero-padded copies of x and dx (asymmetric padding)
  scratch_buffer ws_;           // cuDNN's workspace
  scratch_buffer bn_partials_;  // the batch-norm sums' per-block partial sums
  scratch_buffer colsum_;       // the column sums' partial sums and counters
};

}  // namespace troupe::kernels::cuda_backend_detail
