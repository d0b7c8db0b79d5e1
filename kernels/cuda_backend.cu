// The CUDA backend (kernels/cuda_backend.hpp; its class in
// kernels/cuda_backend_impl.hpp): the handles, the scratch memory the
// backend grows on demand, the dense layers on cuBLAS and cuBLASLt, and the
// error checks. The convolutions on cuDNN are kernels/cuda_backend_conv.cu,
// apart because their descriptors, algorithm ranking and fallback are a
// subsystem of their own that nothing else here touches.
#include "kernels/cuda_backend.hpp"

#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/cuda_backend_impl.hpp"

namespace troupe::kernels {
namespace cuda_backend_detail {

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

cuda_backend_impl::cuda_backend_impl(cudaStream_t stream) : stream_(stream) {
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

cuda_backend_impl::~cuda_backend_impl() {
  plans_.clear();
  lt_plans_.clear();
  if (lt_ws_.p && cudaFree(lt_ws_.p) != cudaSuccess) (void)cudaGetLastError();
  if (lt_ && cublasLtDestroy(lt_) != CUBLAS_STATUS_SUCCESS) (void)cudaGetLastError();
  if (dnn_ && cudnnDestroy(dnn_) != CUDNN_STATUS_SUCCESS) (void)cudaGetLastError();
  for (void* b : {pad_.p, ws_.p, bn_partials_.p, colsum_.p})
    if (b && cudaFree(b) != cudaSuccess) (void)cudaGetLastError();
  if (cublasDestroy(handle_) != CUBLAS_STATUS_SUCCESS) (void)cudaGetLastError();
}

void cuda_backend_impl::use_tf32(tf32_use u) {
  tf32_ = u;
  check_cublas(
      cublasSetMathMode(handle_, u.matmuls ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
      "backend", "cublasSetMathMode");
}

// Row-major y[b,out] is column-major Y^T[out,b], so y = x w is
// Y^T = W^T X^T: gemm(N, N, m=out, n=b, k=in, A=w lda=out, B=x ldb=in).
void cuda_backend_impl::dense_forward(const float* x, const float* w, const float* b, float* y,
                                      int64_t batch, int64_t in, int64_t out, activation act) {
  const char* op = "dense_forward";
  const int m = gemm_dim(out, op, "out"), n = gemm_dim(batch, op, "batch"),
            k = gemm_dim(in, op, "in");
  if (m == 0 || n == 0) return;
  if (b && k > 0 && act != activation::tanh && fused_dense(x, w, b, y, batch, in, out, act)) return;
  if (b) cuda::broadcast_rows(b, y, batch, out, stream_);  // the GEMM adds to the bias
  if (k == 0) {
    if (!b) cuda::fill(y, 0.0f, elems(batch, out), stream_);
  } else {
    const float one = 1.0f, beta = b ? 1.0f : 0.0f;
    check_cublas(
        cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, w, m, x, k, &beta, y, m), op,
        "cublasSgemm");
  }
  if (act == activation::relu) cuda::relu_forward(y, y, elems(batch, out), stream_);
  if (act == activation::tanh) cuda::tanh_forward(y, y, elems(batch, out), stream_);
}

void cuda_backend_impl::activation_backward_bias(activation act, const float* y, const float* dy,
                                                 float* dx, float* db, int64_t rows, int64_t cols,
                                                 bool accumulate) {
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

void cuda_backend_impl::dense_backward(const float* x, const float* w, const float* dy, float* dx,
                                       float* dw, float* db, int64_t batch, int64_t in, int64_t out,
                                       bool accumulate) {
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

void cuda_backend_impl::fill_stats(double* loss_sum, int64_t* correct) {
  // 0.0 and 0 are all-zero bytes.
  check_cuda(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream_), "fill_stats",
             "cudaMemsetAsync");
  check_cuda(cudaMemsetAsync(correct, 0, sizeof(int64_t), stream_), "fill_stats",
             "cudaMemsetAsync");
}

void cuda_backend_impl::copy(float* dst, const float* src, std::size_t n) {
  if (dst == src || n == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
             "copy", "cudaMemcpyAsync");
}

// y = act(x w + b) as one cuBLASLt matmul with a bias (+ReLU) epilogue;
// false where cuBLASLt has no algorithm for the shape (then the caller's
// three launches run).
bool cuda_backend_impl::fused_dense(const float* x, const float* w, const float* b, float* y,
                                    int64_t batch, int64_t in, int64_t out, activation act) {
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
  check_cublas(cublasLtMatmul(lt_, p.desc, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo, ws,
                              kLtWorkspace, stream_),
               op, "cublasLtMatmul");
  return true;
}

// Column-major as the cuBLAS path: Y^T[out, b] = W^T[out, in] X^T[in, b].
std::unique_ptr<lt_plan> cuda_backend_impl::make_lt_plan(const lt_key& k) {
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
cuda::column_sum_scratch cuda_backend_impl::column_scratch(const char* op) {
  constexpr std::size_t partial_floats = std::size_t{1} << 20, arrival_slots = 1 << 14;
  constexpr std::size_t partial_bytes = partial_floats * sizeof(float);
  const bool fresh = colsum_.bytes == 0;
  char* p = grow(colsum_, partial_bytes + arrival_slots * sizeof(unsigned), op,
                 "column sums' partial sums");
  if (fresh)
    check_cuda(cudaMemsetAsync(p + partial_bytes, 0, arrival_slots * sizeof(unsigned), stream_), op,
               "cudaMemsetAsync (column sums' counters)");
  return {reinterpret_cast<float*>(p), partial_floats,
          reinterpret_cast<unsigned*>(p + partial_bytes), arrival_slots};
}

// One size for every shape (cuda::batch_norm_splits gives at most
// channel_sum_blocks + channels - 1 blocks, channels at most 65535): a
// captured step's graph holds its address, so it is never replaced.
double* cuda_backend_impl::bn_partials(int64_t batch, int64_t channels, int64_t spatial,
                                       const char* op) {
  if (batch < 0 || channels < 0 || spatial < 0) return nullptr;  // the kernels' check says so
  constexpr std::size_t most = 2 * (cuda::channel_sum_blocks + 65535);
  return reinterpret_cast<double*>(
      grow(bn_partials_, most * sizeof(double), op, "batch-norm sums"));
}

// b's memory, at least `bytes` long. Growing it waits for the work queued
// on the stream, which may still use the old memory; that happens only
// when a larger shape first comes.
char* cuda_backend_impl::grow(scratch_buffer& b, std::size_t bytes, const char* op,
                              const char* what) {
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

}  // namespace cuda_backend_detail

std::unique_ptr<backend> make_cuda_backend(cudaStream_t stream) {
  return std::make_unique<cuda_backend_detail::cuda_backend_impl>(stream);
}

}  // namespace troupe::kernels
