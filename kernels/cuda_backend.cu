// The backend interface on a CUDA stream: cuBLAS for the dense layers, the
// kernels of kernels/cuda_kernels.cu for everything else.
#include "kernels/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda_kernels.hpp"

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

// cuBLAS takes int dimensions; refuse what does not fit instead of truncating.
int gemm_dim(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > static_cast<int64_t>(std::numeric_limits<int>::max()))
    fail(op, std::string("dimension ") + what + " = " + std::to_string(v) + " out of range");
  return static_cast<int>(v);
}

std::size_t elems(int64_t a, int64_t b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

class cuda_backend_impl final : public backend {
 public:
  explicit cuda_backend_impl(cudaStream_t stream) : stream_(stream) {
    check_cublas(cublasCreate(&handle_), "backend", "cublasCreate");
    try {
      check_cublas(cublasSetStream(handle_, stream_), "backend", "cublasSetStream");
      // Plain FP32 (no TF32 tensor cores): within ~1e-6 relative of the CPU.
      check_cublas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "backend", "cublasSetMathMode");
      check_cublas(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST), "backend",
                   "cublasSetPointerMode");
    } catch (...) {
      cublasDestroy(handle_);
      throw;
    }
  }
  ~cuda_backend_impl() override {
    if (cublasDestroy(handle_) != CUBLAS_STATUS_SUCCESS) (void)cudaGetLastError();
  }
  cuda_backend_impl(const cuda_backend_impl&) = delete;
  cuda_backend_impl& operator=(const cuda_backend_impl&) = delete;

  const char* name() const override { return "cuda"; }

  // Row-major y[b,out] is column-major Y^T[out,b], so y = x w is
  // Y^T = W^T X^T: gemm(N, N, m=out, n=b, k=in, A=w lda=out, B=x ldb=in).
  void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t batch,
                     int64_t in, int64_t out, activation act) override {
    const char* op = "dense_forward";
    const int m = gemm_dim(out, op, "out"), n = gemm_dim(batch, op, "batch"),
              k = gemm_dim(in, op, "in");
    if (m == 0 || n == 0) return;
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
    if (act == activation::relu) cuda::relu_backward(y, dy, dx, n, stream_);
    if (act == activation::tanh) cuda::tanh_backward(y, dy, dx, n, stream_);
    if (act == activation::none && dx != dy)
      check_cuda(cudaMemcpyAsync(dx, dy, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                 "activation_backward_bias", "cudaMemcpyAsync");
    if (db) cuda::column_sums(dx, db, rows, cols, accumulate, stream_);
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
    if (db) cuda::column_sums(dy, db, batch, out, accumulate, stream_);
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

  void conv2d_forward(const conv2d_shape& /*s*/, const float* /*x*/, const float* /*w*/,
                      const float* /*b*/, float* /*y*/) override {
    throw std::logic_error("cuda conv2d_forward: not implemented yet");
  }
  void conv2d_backward(const conv2d_shape& /*s*/, const float* /*x*/, const float* /*w*/,
                       const float* /*dy*/, float* /*dx*/, float* /*dw*/, float* /*db*/,
                       bool /*accumulate*/) override {
    throw std::logic_error("cuda conv2d_backward: not implemented yet");
  }
  std::size_t pool2d_workspace_bytes(const pool2d_shape& /*s*/) override {
    throw std::logic_error("cuda pool2d_workspace_bytes: not implemented yet");
  }
  void pool2d_forward(const pool2d_shape& /*s*/, const float* /*x*/, float* /*y*/,
                      void* /*workspace*/) override {
    throw std::logic_error("cuda pool2d_forward: not implemented yet");
  }
  void pool2d_backward(const pool2d_shape& /*s*/, const float* /*x*/, const float* /*dy*/,
                       float* /*dx*/, const void* /*workspace*/) override {
    throw std::logic_error("cuda pool2d_backward: not implemented yet");
  }
  void unary_forward(unary_op /*op*/, float /*alpha*/, const float* /*x*/, float* /*y*/,
                     std::size_t /*n*/) override {
    throw std::logic_error("cuda unary_forward: not implemented yet");
  }
  void unary_backward(unary_op /*op*/, float /*alpha*/, const float* /*x*/, const float* /*y*/,
                      const float* /*dy*/, float* /*dx*/, std::size_t /*n*/) override {
    throw std::logic_error("cuda unary_backward: not implemented yet");
  }
  void batch_norm_sums(const float* /*x*/, int64_t /*batch*/, int64_t /*channels*/,
                       int64_t /*spatial*/, float* /*sums*/) override {
    throw std::logic_error("cuda batch_norm_sums: not implemented yet");
  }
  void batch_norm_statistics(const float* /*sums*/, int64_t /*channels*/, double /*count*/,
                             float /*eps*/, float /*momentum*/, float* /*mean*/, float* /*invstd*/,
                             float* /*running_mean*/, float* /*running_var*/) override {
    throw std::logic_error("cuda batch_norm_statistics: not implemented yet");
  }
  void invstd_from_variance(const float* /*var*/, float /*eps*/, float* /*invstd*/,
                            std::size_t /*n*/) override {
    throw std::logic_error("cuda invstd_from_variance: not implemented yet");
  }
  void batch_norm_forward(const float* /*x*/, const float* /*mean*/, const float* /*invstd*/,
                          const float* /*gamma*/, const float* /*beta*/, float* /*y*/,
                          int64_t /*batch*/, int64_t /*channels*/, int64_t /*spatial*/) override {
    throw std::logic_error("cuda batch_norm_forward: not implemented yet");
  }
  void batch_norm_backward_sums(const float* /*x*/, const float* /*dy*/, const float* /*mean*/,
                                const float* /*invstd*/, int64_t /*batch*/, int64_t /*channels*/,
                                int64_t /*spatial*/, float* /*sums*/) override {
    throw std::logic_error("cuda batch_norm_backward_sums: not implemented yet");
  }
  void batch_norm_backward(const float* /*x*/, const float* /*dy*/, const float* /*mean*/,
                           const float* /*invstd*/, const float* /*gamma*/, const float* /*sums*/,
                           double /*count*/, float* /*dx*/, int64_t /*batch*/, int64_t /*channels*/,
                           int64_t /*spatial*/) override {
    throw std::logic_error("cuda batch_norm_backward: not implemented yet");
  }
  void layer_norm_forward(const float* /*x*/, const float* /*gamma*/, const float* /*beta*/,
                          float* /*y*/, float* /*mean*/, float* /*invstd*/, int64_t /*rows*/,
                          int64_t /*cols*/, float /*eps*/) override {
    throw std::logic_error("cuda layer_norm_forward: not implemented yet");
  }
  void layer_norm_backward(const float* /*x*/, const float* /*dy*/, const float* /*gamma*/,
                           const float* /*mean*/, const float* /*invstd*/, float* /*dx*/,
                           float* /*dgamma*/, float* /*dbeta*/, int64_t /*rows*/, int64_t /*cols*/,
                           bool /*accumulate*/) override {
    throw std::logic_error("cuda layer_norm_backward: not implemented yet");
  }
  void dropout(const float* /*x*/, float* /*y*/, int64_t /*rows*/, int64_t /*cols*/, float /*rate*/,
               uint64_t /*seed*/, const int64_t* /*ids*/) override {
    throw std::logic_error("cuda dropout: not implemented yet");
  }
  void embedding_forward(const float* /*ids*/, const float* /*table*/, float* /*out*/,
                         int64_t /*rows*/, int64_t /*len*/, int64_t /*dim*/,
                         bool /*bag_mean*/) override {
    throw std::logic_error("cuda embedding_forward: not implemented yet");
  }
  void embedding_backward(const float* /*ids*/, const float* /*dy*/, float* /*dtable*/,
                          int64_t /*rows*/, int64_t /*len*/, int64_t /*vocab*/, int64_t /*dim*/,
                          bool /*bag_mean*/, bool /*accumulate*/) override {
    throw std::logic_error("cuda embedding_backward: not implemented yet");
  }
  void sigmoid_cross_entropy(const float* /*logits*/, const float* /*targets*/, int64_t /*batch*/,
                             int64_t /*outputs*/, float /*grad_scale*/, float* /*dlogits*/,
                             double* /*loss_sum*/, int64_t* /*correct*/) override {
    throw std::logic_error("cuda sigmoid_cross_entropy: not implemented yet");
  }
  void mean_squared_error(const float* /*pred*/, const float* /*targets*/, int64_t /*batch*/,
                          int64_t /*outputs*/, float /*grad_scale*/, float* /*dpred*/,
                          double* /*loss_sum*/) override {
    throw std::logic_error("cuda mean_squared_error: not implemented yet");
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

 private:
  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

std::unique_ptr<backend> make_cuda_backend(cudaStream_t stream) {
  return std::make_unique<cuda_backend_impl>(stream);
}

}  // namespace troupe::kernels
