// The backend interface on a CUDA stream: cuBLAS for the dense layers, cuDNN
// for the convolutions, the kernels of kernels/cuda_kernels.cu and
// kernels/cuda_layers.cu for everything else.
#include "kernels/cuda_backend.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_kernels.hpp"
#include "kernels/cuda_layers.hpp"

namespace troupe::kernels {
namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::runtime_error(std::string("cuda ") + op + ": " + what);
}

void check_cuda(cudaError_t e, const char* op, const char* call) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // a later launch check must not report it again
  fail(op, std::string(call) + ": " + cudaGetErrorString(e));
}

void check_cublas(cublasStatus_t s, const char* op, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  (void)cudaGetLastError();
  fail(op, std::string(call) + ": " + cublasGetStatusString(s) + " (cublasStatus_t " +
               std::to_string(static_cast<int>(s)) + ")");
}

void check_cudnn(cudnnStatus_t s, const char* op, const char* call) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  (void)cudaGetLastError();
  fail(op, std::string(call) + ": " + cudnnGetErrorString(s) + " (cudnnStatus_t " +
               std::to_string(static_cast<int>(s)) + ")");
}

// cuBLAS takes int dimensions; refuse what does not fit instead of truncating.
int gemm_dim(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > static_cast<int64_t>(std::numeric_limits<int>::max()))
    fail(op, std::string("dimension ") + what + " = " + std::to_string(v) + " out of range");
  return static_cast<int>(v);
}

std::size_t elems(int64_t a, int64_t b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

// The padded copies in the padding buffer start at 256-byte boundaries
// (what cudaMalloc gives, and what vector loads like).
std::size_t aligned(std::size_t bytes) {
  return (bytes + 255) & ~std::size_t{255};
}

// A convolution algorithm may ask for at most this much workspace; larger
// ones (some FFT variants) are passed over for the next in cuDNN's ranking.
constexpr std::size_t max_conv_workspace = std::size_t{1} << 30;

// The usable algorithms of cuDNN's heuristic ranking (best first), the
// deterministic ones first: supported, within the workspace limit, and
// without tensor-core math unless TF32 is allowed (it puts the result ~1e-3
// from the CPU's).
template <class Perf>
auto rank_algorithms(const Perf* perf, int n, bool tf32) {
  std::vector<decltype(perf->algo)> deterministic, other;
  for (int i = 0; i < n; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > max_conv_workspace) continue;
    if (!tf32 &&
        (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    (p.determinism == CUDNN_DETERMINISTIC ? deterministic : other).push_back(p.algo);
  }
  deterministic.insert(deterministic.end(), other.begin(), other.end());
  return deterministic;
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
constexpr std::size_t kLtWorkspace = 4 << 20;

conv_key key_of(const conv2d_shape& s) {
  return {s.batch,    s.in_channels, s.in_h,      s.in_w,       s.out_channels, s.kernel_h,
          s.kernel_w, s.stride_h,    s.stride_w,  s.dilation_h, s.dilation_w,   s.pad_top,
          s.pad_left, s.pad_bottom,  s.pad_right, s.groups};
}

class cuda_backend_impl final : public backend {
 public:
  explicit cuda_backend_impl(cudaStream_t stream) : stream_(stream) {
    check_cublas(cublasCreate(&handle_), "backend", "cublasCreate");
    try {
      check_cublas(cublasLtCreate(&lt_), "backend", "cublasLtCreate");
      check_cublas(cublasSetStream(handle_, stream_), "backend", "cublasSetStream");
      // Plain FP32 (no TF32 tensor cores): within ~1e-6 relative of the CPU.
      check_cublas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "backend", "cublasSetMathMode");
      check_cublas(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST), "backend",
                   "cublasSetPointerMode");
    } catch (...) {
      if (lt_) cublasLtDestroy(lt_);
      cublasDestroy(handle_);
      throw;
    }
  }
  ~cuda_backend_impl() override {
    plans_.clear();
    lt_plans_.clear();
    if (lt_ws_.p && cudaFree(lt_ws_.p) != cudaSuccess) (void)cudaGetLastError();
    if (lt_ && cublasLtDestroy(lt_) != CUBLAS_STATUS_SUCCESS) (void)cudaGetLastError();
    if (dnn_ && cudnnDestroy(dnn_) != CUDNN_STATUS_SUCCESS) (void)cudaGetLastError();
    for (void* b : {pad_.p, ws_.p, bn_partials_.p, colsum_.p})
      if (b && cudaFree(b) != cudaSuccess) (void)cudaGetLastError();
    if (cublasDestroy(handle_) != CUBLAS_STATUS_SUCCESS) (void)cudaGetLastError();
  }
  cuda_backend_impl(const cuda_backend_impl&) = delete;
  cuda_backend_impl& operator=(const cuda_backend_impl&) = delete;

  const char* name() const override { return "cuda"; }

  void use_tf32(tf32_use u) override {
    tf32_ = u;
    check_cublas(
        cublasSetMathMode(handle_, u.matmuls ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
        "backend", "cublasSetMathMode");
  }

  // Row-major y[b,out] is column-major Y^T[out,b], so y = x w is
  // Y^T = W^T X^T: gemm(N, N, m=out, n=b, k=in, A=w lda=out, B=x ldb=in).
  void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                     int64_t in, int64_t out, activation act) override {
    const char* op = "dense_forward";
    const int m = gemm_dim(out, op, "out"), n = gemm_dim(batch, op, "batch"),
              k = gemm_dim(in, op, "in");
    if (m == 0 || n == 0) return;
    if (b && k > 0 && act != activation::tanh && fused_dense(x, w, b, y, batch, in, out, act))
      return;
    if (b) cuda::broadcast_rows(b, y, batch, out, stream_);  // the GEMM adds to the bias
    if (k == 0) {
      if (!b) cuda::fill(y, 0.0f, elems(batch, out), stream_);
    } else {
      const float one = 1.0f, beta = b ? 1.0f : 0.0f;
      check_cublas(
          cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, w, m, x, k, &beta, y, m),
          op, "cublasSgemm");
    }
    if (act == activation::relu) cuda::relu_forward(y, y, elems(batch, out), stream_);
    if (act == activation::tanh) cuda::tanh_forward(y, y, elems(batch, out), stream_);
  }

  void activation_backward_bias(activation act, const float* y, const float* dy, float* dx,
                                float* db, int64_t rows, int64_t cols, bool accumulate) override {
    const std::size_t n = elems(rows, cols);
    if (db) {  // one pass: the gradient and its column sums
      cuda::activation_backward_column_sums(act, y, dy, dx, db, rows, cols, accumulate,
                                            column_scratch("activation_backward_bias"), stream_);
      return;
    }
    if (act == activation::relu) cuda::relu_backward(y, dy, dx, n, stream_);
    if (act == activation::tanh) cuda::tanh_backward(y, dy, dx, n, stream_);
    if (act == activation::none && dx != dy)
      check_cuda(cudaMemcpyAsync(dx, dy, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                 "activation_backward_bias", "cudaMemcpyAsync");
  }

  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int64_t batch, int64_t in, int64_t out, bool accumulate) override {
    const char* op = "dense_backward";
    const int nb = gemm_dim(batch, op, "batch"), ni = gemm_dim(in, op, "in"),
              no = gemm_dim(out, op, "out");
    const float one = 1.0f, zero = 0.0f;
    // dw[in,out] = x^T dy: column-major dW^T[out,in] = dY^T X,
    // gemm(N, T, m=out, n=in, k=b, A=dy lda=out, B=x ldb=in, C=dw ldc=out).
    if (dw && ni > 0 && no > 0) {
      if (nb > 0) {
        check_cublas(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, no, ni, nb, &one, dy, no, x, ni,
                                 accumulate ? &one : &zero, dw, no),
                     op, "cublasSgemm (dw)");
      } else if (!accumulate) {
        cuda::fill(dw, 0.0f, elems(in, out), stream_);
      }
    }
    // db[out] = column sums of dy (added to db when accumulating).
    if (db) cuda::column_sums(dy, db, batch, out, accumulate, column_scratch(op), stream_);
    // dx[b,in] = dy w^T: column-major dX^T[in,b] = W dY^T,
    // gemm(T, N, m=in, n=b, k=out, A=w lda=out, B=dy ldb=out, C=dx ldc=in).
    if (dx && nb > 0 && ni > 0) {
      if (no > 0) {
        check_cublas(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, ni, nb, no, &one, w, no, dy, no,
                                 &zero, dx, ni),
                     op, "cublasSgemm (dx)");
      } else {
        cuda::fill(dx, 0.0f, elems(batch, in), stream_);
      }
    }
  }

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

  // ---- layers: the convolutions on cuDNN, the rest kernels/cuda_layers.cu --

  void conv2d_forward(const conv2d_shape& s, const float* x, const float* w, const float* b,
                      float* y) override {
    const char* op = "conv2d_forward";
    if (s.batch == 0 || s.out_channels == 0) return;  // y is empty
    conv_plan& p = plan(s, op);
    choose_forward(p, op);
    const float* in = x;
    if (p.padded) {
      float* xp = reinterpret_cast<float*>(grow(pad_, p.padded_bytes, op, "padding"));
      cuda::pad_planes(x, xp, s.batch * s.in_channels, s.in_h, s.in_w, p.hp, p.wp, p.extra_top,
                       p.extra_left, stream_);
      in = xp;
    }
    const float one = 1.0f, zero = 0.0f;
    run_conv(
        p.fwd, op, "cudnnConvolutionForward",
        [&](cudnnConvolutionFwdAlgo_t a, std::size_t* ws) {
          return cudnnGetConvolutionForwardWorkspaceSize(dnn_, p.x, p.w, p.conv, p.y, a, ws);
        },
        [&](cudnnConvolutionFwdAlgo_t a, void* ws, std::size_t ws_bytes) {
          return cudnnConvolutionForward(dnn_, &one, p.x, in, p.w, w, p.conv, a, ws, ws_bytes,
                                         &zero, p.y, y);
        });
    // Not cudnnAddTensor: its generic kernel took ~4x as long.
    if (b) cuda::add_channel_bias(y, b, s.batch, s.out_channels, s.out_h() * s.out_w(), stream_);
  }

  void conv2d_backward(const conv2d_shape& s, const float* x, const float* w, const float* dy,
                       float* dx, float* dw, float* db, bool accumulate) override {
    const char* op = "conv2d_backward";
    if (s.batch == 0 || s.out_channels == 0) {
      // No positions: the parameter gradients are sums of nothing.
      if (!accumulate && dw && s.groups > 0)
        cuda::fill(dw, 0.0f,
                   elems(s.out_channels, s.in_channels / s.groups * s.kernel_h * s.kernel_w),
                   stream_);
      if (!accumulate && db)
        cuda::fill(db, 0.0f, static_cast<std::size_t>(s.out_channels), stream_);
      if (dx && s.out_channels == 0)
        cuda::fill(dx, 0.0f, elems(s.batch * s.in_channels, s.in_h * s.in_w), stream_);
      return;
    }
    conv_plan& p = plan(s, op);
    if (dw) choose_backward_filter(p, op);
    if (dx) choose_backward_data(p, op);
    // The padding buffer: the padded x (for dw), then the padded dx.
    const std::size_t xp_bytes = p.padded && dw ? aligned(p.padded_bytes) : 0;
    const std::size_t dxp_bytes = p.padded && dx ? p.padded_bytes : 0;
    char* pads = xp_bytes + dxp_bytes ? grow(pad_, xp_bytes + dxp_bytes, op, "padding") : nullptr;
    const float one = 1.0f, zero = 0.0f;
    const float* beta = accumulate ? &one : &zero;
    // Not cudnnConvolutionBackwardBias: one block a channel, ~10x as long.
    if (db)
      cuda::channel_bias_gradient(
          dy, s.batch, s.out_channels, s.out_h() * s.out_w(), db, accumulate,
          bn_partials(s.batch, s.out_channels, s.out_h() * s.out_w(), op), stream_);
    if (dw) {
      const float* in = x;
      if (p.padded) {
        float* xp = reinterpret_cast<float*>(pads);
        cuda::pad_planes(x, xp, s.batch * s.in_channels, s.in_h, s.in_w, p.hp, p.wp, p.extra_top,
                         p.extra_left, stream_);
        in = xp;
      }
      run_conv(
          p.bwd_filter, op, "cudnnConvolutionBackwardFilter",
          [&](cudnnConvolutionBwdFilterAlgo_t a, std::size_t* ws) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, p.x, p.y, p.conv, p.w, a,
                                                                  ws);
          },
          [&](cudnnConvolutionBwdFilterAlgo_t a, void* ws, std::size_t ws_bytes) {
            return cudnnConvolutionBackwardFilter(dnn_, &one, p.x, in, p.y, dy, p.conv, a, ws,
                                                  ws_bytes, beta, p.w, dw);
          });
    }
    if (dx) {
      float* out = p.padded ? reinterpret_cast<float*>(pads + xp_bytes) : dx;
      run_conv(
          p.bwd_data, op, "cudnnConvolutionBackwardData",
          [&](cudnnConvolutionBwdDataAlgo_t a, std::size_t* ws) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, p.w, p.y, p.conv, p.x, a, ws);
          },
          [&](cudnnConvolutionBwdDataAlgo_t a, void* ws, std::size_t ws_bytes) {
            return cudnnConvolutionBackwardData(dnn_, &one, p.w, w, p.y, dy, p.conv, a, ws,
                                                ws_bytes, &zero, p.x, out);
          });
      if (p.padded)
        cuda::crop_planes(out, dx, s.batch * s.in_channels, s.in_h, s.in_w, p.hp, p.wp, p.extra_top,
                          p.extra_left, stream_);
    }
  }

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
  void fill_stats(double* loss_sum, int64_t* correct) override {
    // 0.0 and 0 are all-zero bytes.
    check_cuda(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream_), "fill_stats",
               "cudaMemsetAsync");
    check_cuda(cudaMemsetAsync(correct, 0, sizeof(int64_t), stream_), "fill_stats",
               "cudaMemsetAsync");
  }
  void copy(float* dst, const float* src, std::size_t n) override {
    if (dst == src || n == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
               "copy", "cudaMemcpyAsync");
  }
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
  // The cuDNN handle, made on first use: cudnnCreate takes a while and some
  // memory, which a backend without convolutions should not pay.
  void ensure_cudnn(const char* op) {
    if (dnn_) return;
    cudnnHandle_t h = nullptr;
    check_cudnn(cudnnCreate(&h), op, "cudnnCreate");
    const cudnnStatus_t st = cudnnSetStream(h, stream_);
    if (st != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(h);
      check_cudnn(st, op, "cudnnSetStream");
    }
    dnn_ = h;
  }

  // b's memory, at least `bytes` long. Growing it waits for the work queued
  // on the stream, which may still use the old memory; that happens only
  // when a larger shape first comes.
  // y = act(x w + b) as one cuBLASLt matmul with a bias (+ReLU) epilogue;
  // false where cuBLASLt has no algorithm for the shape (then the caller's
  // three launches run).
  bool fused_dense(const float* x, const float* w, const float* b, float* y, int64_t batch,
                   int64_t in, int64_t out, activation act) {
    const lt_key key{batch, in, out, act == activation::relu ? 1 : 0};
    auto it = lt_plans_.find(key);
    if (it == lt_plans_.end()) it = lt_plans_.emplace(key, make_lt_plan(key)).first;
    lt_plan& p = *it->second;
    if (!p.usable) return false;
    const char* op = "dense_forward";
    check_cublas(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b), op,
        "cublasLtMatmulDescSetAttribute (bias)");
    char* ws = grow(lt_ws_, kLtWorkspace, op, "cuBLASLt workspace");
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasLtMatmul(lt_, p.desc, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo,
                                ws, kLtWorkspace, stream_),
                 op, "cublasLtMatmul");
    return true;
  }
  // Column-major as the cuBLAS path: Y^T[out, b] = W^T[out, in] X^T[in, b].
  std::unique_ptr<lt_plan> make_lt_plan(const lt_key& k) {
    auto p = std::make_unique<lt_plan>();
    const auto m = static_cast<uint64_t>(k[2]), n = static_cast<uint64_t>(k[0]),
               kk = static_cast<uint64_t>(k[1]);
    const cublasLtEpilogue_t epilogue = k[3] ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulPreference_t pref = nullptr;
    const cublasComputeType_t compute =
        tf32_.matmuls ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    bool ok = cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                             sizeof epilogue) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, m, kk, static_cast<int64_t>(m)) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, kk, n, static_cast<int64_t>(kk)) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, m, n, static_cast<int64_t>(m)) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    const std::size_t ws = kLtWorkspace;
    if (ok)
      ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (ok)
      ok = cublasLtMatmulAlgoGetHeuristic(lt_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result,
                                          &found) == CUBLAS_STATUS_SUCCESS &&
           found > 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ok) p->algo = result.algo;
    p->usable = ok;
    return p;
  }

  // The column sums' scratch, one size for every shape (a captured step's
  // graph holds its address); its counters zeroed once, and left at zero by
  // every launch.
  cuda::column_sum_scratch column_scratch(const char* op) {
    constexpr std::size_t partial_floats = std::size_t{1} << 20, arrival_slots = 1 << 14;
    constexpr std::size_t partial_bytes = partial_floats * sizeof(float);
    const bool fresh = colsum_.bytes == 0;
    char* p = grow(colsum_, partial_bytes + arrival_slots * sizeof(unsigned), op,
                   "column sums' partial sums");
    if (fresh)
      check_cuda(cudaMemsetAsync(p + partial_bytes, 0, arrival_slots * sizeof(unsigned), stream_),
                 op, "cudaMemsetAsync (column sums' counters)");
    return {reinterpret_cast<float*>(p), partial_floats,
            reinterpret_cast<unsigned*>(p + partial_bytes), arrival_slots};
  }

  // One size for every shape (cuda::batch_norm_splits gives at most
  // channel_sum_blocks + channels - 1 blocks, channels at most 65535): a
  // captured step's graph holds its address, so it is never replaced.
  double* bn_partials(int64_t batch, int64_t channels, int64_t spatial, const char* op) {
    if (batch < 0 || channels < 0 || spatial < 0) return nullptr;  // the kernels' check says so
    constexpr std::size_t most = 2 * (cuda::channel_sum_blocks + 65535);
    return reinterpret_cast<double*>(
        grow(bn_partials_, most * sizeof(double), op, "batch-norm sums"));
  }

  char* grow(scratch_buffer& b, std::size_t bytes, const char* op, const char* what) {
    if (bytes <= b.bytes) return static_cast<char*>(b.p);
    check_cuda(cudaStreamSynchronize(stream_), op, "cudaStreamSynchronize (scratch)");
    if (b.p) {
      check_cuda(cudaFree(b.p), op, "cudaFree (scratch)");
      b.p = nullptr;
      b.bytes = 0;
    }
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), op,
               ("cudaMalloc (" + std::to_string(bytes) + " bytes of " + what + ")").c_str());
    b.p = p;
    b.bytes = bytes;
    return static_cast<char*>(p);
  }

  // Runs one direction with its chosen algorithm and workspace. An algorithm
  // the heuristics offered may still refuse the shape at the call (PyTorch
  // meets this too, and walks its list the same way): the next in the
  // ranking takes over, for this call and the later ones.
  template <class Algo, class WorkspaceOf, class Run>
  void run_conv(algo_choice<Algo>& c, const char* op, const char* call, WorkspaceOf workspace_of,
                Run run) {
    for (;;) {
      void* ws = c.ws ? grow(ws_, c.ws, op, "cuDNN workspace") : nullptr;
      const cudnnStatus_t st = run(c.algo(), ws, c.ws);
      if (st == CUDNN_STATUS_SUCCESS) return;
      const bool not_supported = static_cast<int>(st) / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000;
      if (!not_supported || c.at + 1 >= c.ranked.size()) check_cudnn(st, op, call);
      ++c.at;
      check_cudnn(workspace_of(c.algo(), &c.ws), op, "cudnnGetConvolution*WorkspaceSize");
    }
  }

  conv_plan& plan(const conv2d_shape& s, const char* op) {
    const conv_key key = key_of(s);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    ensure_cudnn(op);
    if (s.batch < 0 || s.in_channels < 1 || s.in_h < 1 || s.in_w < 1 || s.out_channels < 1 ||
        s.kernel_h < 1 || s.kernel_w < 1 || s.stride_h < 1 || s.stride_w < 1 || s.dilation_h < 1 ||
        s.dilation_w < 1 || s.pad_top < 0 || s.pad_left < 0 || s.pad_bottom < 0 ||
        s.pad_right < 0 || s.groups < 1 || s.in_channels % s.groups != 0 ||
        s.out_channels % s.groups != 0 || s.out_h() < 1 || s.out_w() < 1)
      fail(op, "invalid convolution shape");
    auto p = std::make_unique<conv_plan>();
    const int64_t ph = std::min(s.pad_top, s.pad_bottom), pw = std::min(s.pad_left, s.pad_right);
    p->extra_top = s.pad_top - ph;
    p->extra_left = s.pad_left - pw;
    p->hp = s.in_h + p->extra_top + (s.pad_bottom - ph);
    p->wp = s.in_w + p->extra_left + (s.pad_right - pw);
    p->padded = p->hp != s.in_h || p->wp != s.in_w;
    p->padded_bytes = elems(s.batch * s.in_channels, p->hp * p->wp) * sizeof(float);
    const int n = gemm_dim(s.batch, op, "batch"), c = gemm_dim(s.in_channels, op, "in_channels"),
              k = gemm_dim(s.out_channels, op, "out_channels");
    check_cudnn(cudnnCreateTensorDescriptor(&p->x), op, "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&p->y), op, "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&p->bias), op, "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&p->w), op, "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&p->conv), op, "cudnnCreateConvolutionDescriptor");
    check_cudnn(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c,
                                           gemm_dim(p->hp, op, "padded height"),
                                           gemm_dim(p->wp, op, "padded width")),
                op, "cudnnSetTensor4dDescriptor (x)");
    check_cudnn(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k,
                                           gemm_dim(s.in_channels / s.groups, op, "in/groups"),
                                           gemm_dim(s.kernel_h, op, "kernel_h"),
                                           gemm_dim(s.kernel_w, op, "kernel_w")),
                op, "cudnnSetFilter4dDescriptor");
    check_cudnn(
        cudnnSetConvolution2dDescriptor(
            p->conv, gemm_dim(ph, op, "pad_h"), gemm_dim(pw, op, "pad_w"),
            gemm_dim(s.stride_h, op, "stride_h"), gemm_dim(s.stride_w, op, "stride_w"),
            gemm_dim(s.dilation_h, op, "dilation_h"), gemm_dim(s.dilation_w, op, "dilation_w"),
            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        op, "cudnnSetConvolution2dDescriptor");
    check_cudnn(cudnnSetConvolutionGroupCount(p->conv, gemm_dim(s.groups, op, "groups")), op,
                "cudnnSetConvolutionGroupCount");
    // CUDNN_DEFAULT_MATH lets FP32 convolutions use TF32 tensor cores on
    // Ampere and later; FMA keeps them plain FP32.
    check_cudnn(cudnnSetConvolutionMathType(
                    p->conv, tf32_.convolutions ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
                op, "cudnnSetConvolutionMathType");
    int on = 0, oc = 0, oh = 0, ow = 0;
    check_cudnn(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &on, &oc, &oh, &ow), op,
                "cudnnGetConvolution2dForwardOutputDim");
    if (on != n || oc != k || oh != s.out_h() || ow != s.out_w())
      fail(op, "cuDNN's output shape " + std::to_string(oh) + "x" + std::to_string(ow) +
                   " is not conv2d_shape's " + std::to_string(s.out_h()) + "x" +
                   std::to_string(s.out_w()));
    check_cudnn(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, oh, ow),
                op, "cudnnSetTensor4dDescriptor (y)");
    check_cudnn(
        cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, k, 1, 1), op,
        "cudnnSetTensor4dDescriptor (bias)");
    return *plans_.emplace(key, std::move(p)).first->second;
  }

  void choose_forward(conv_plan& p, const char* op) {
    if (p.fwd.ready) return;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    check_cudnn(cudnnGetConvolutionForwardAlgorithm_v7(
                    dnn_, p.x, p.w, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf),
                op, "cudnnGetConvolutionForwardAlgorithm_v7");
    p.fwd.ranked = rank_algorithms(perf, got, tf32_.convolutions);
    if (p.fwd.ranked.empty()) fail(op, "cuDNN offers no usable forward algorithm for this shape");
    check_cudnn(cudnnGetConvolutionForwardWorkspaceSize(dnn_, p.x, p.w, p.conv, p.y, p.fwd.algo(),
                                                        &p.fwd.ws),
                op, "cudnnGetConvolutionForwardWorkspaceSize");
    p.fwd.ready = true;
  }

  void choose_backward_data(conv_plan& p, const char* op) {
    if (p.bwd_data.ready) return;
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int got = 0;
    check_cudnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    dnn_, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf),
                op, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    p.bwd_data.ranked = rank_algorithms(perf, got, tf32_.convolutions);
    if (p.bwd_data.ranked.empty())
      fail(op, "cuDNN offers no usable backward-data algorithm for this shape");
    check_cudnn(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, p.w, p.y, p.conv, p.x,
                                                             p.bwd_data.algo(), &p.bwd_data.ws),
                op, "cudnnGetConvolutionBackwardDataWorkspaceSize");
    p.bwd_data.ready = true;
  }

  void choose_backward_filter(conv_plan& p, const char* op) {
    if (p.bwd_filter.ready) return;
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int got = 0;
    check_cudnn(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            dnn_, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, perf),
        op, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    p.bwd_filter.ranked = rank_algorithms(perf, got, tf32_.convolutions);
    if (p.bwd_filter.ranked.empty())
      fail(op, "cuDNN offers no usable backward-filter algorithm for this shape");
    check_cudnn(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                    dnn_, p.x, p.y, p.conv, p.w, p.bwd_filter.algo(), &p.bwd_filter.ws),
                op, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    p.bwd_filter.ready = true;
  }

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

}  // namespace

std::unique_ptr<backend> make_cuda_backend(cudaStream_t stream) {
  return std::make_unique<cuda_backend_impl>(stream);
}

}  // namespace troupe::kernels
