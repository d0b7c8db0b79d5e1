// The CUDA backend's convolutions (kernels/cuda_backend_impl.hpp) on cuDNN:
// the descriptors of each shape, the algorithm of each direction chosen from
// cuDNN's ranking (deterministic first, within a workspace limit, TF32 only
// where allowed) with a fallback to the next where one refuses the shape,
// and the zero padding that gives cuDNN's symmetric padding an asymmetric
// one. Its own file because this is a subsystem of its own: the rest of the
// backend (kernels/cuda_backend.cu) needs none of it.
#include <cudnn.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda_backend_impl.hpp"
#include "kernels/cuda_layers.hpp"

namespace troupe::kernels::cuda_backend_detail {
namespace {

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

conv_key key_of(const conv2d_shape& s) {
  return {s.batch,    s.in_channels, s.in_h,      s.in_w,       s.out_channels, s.kernel_h,
          s.kernel_w, s.stride_h,    s.stride_w,  s.dilation_h, s.dilation_w,   s.pad_top,
          s.pad_left, s.pad_bottom,  s.pad_right, s.groups};
}

}  // namespace

// The cuDNN handle, made on first use: cudnnCreate takes a while and some
// memory, which a backend without convolutions should not pay.
void cuda_backend_impl::ensure_cudnn(const char* op) {
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

conv_plan& cuda_backend_impl::plan(const conv2d_shape& s, const char* op) {
  const conv_key key = key_of(s);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  ensure_cudnn(op);
  if (s.batch < 0 || s.in_channels < 1 || s.in_h < 1 || s.in_w < 1 || s.out_channels < 1 ||
      s.kernel_h < 1 || s.kernel_w < 1 || s.stride_h < 1 || s.stride_w < 1 || s.dilation_h < 1 ||
      s.dilation_w < 1 || s.pad_top < 0 || s.pad_left < 0 || s.pad_bottom < 0 || s.pad_right < 0 ||
      s.groups < 1 || s.in_channels % s.groups != 0 || s.out_channels % s.groups != 0 ||
      s.out_h() < 1 || s.out_w() < 1)
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
  check_cudnn(cudnnSetConvolutionMathType(p->conv,
                                          tf32_.convolutions ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
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
  check_cudnn(cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, k, 1, 1),
              op, "cudnnSetTensor4dDescriptor (bias)");
  return *plans_.emplace(key, std::move(p)).first->second;
}

void cuda_backend_impl::choose_forward(conv_plan& p, const char* op) {
  if (p.fwd.ready) return;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int got = 0;
  check_cudnn(cudnnGetConvolutionForwardAlgorithm_v7(dnn_, p.x, p.w, p.conv, p.y,
                                                     CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf),
              op, "cudnnGetConvolutionForwardAlgorithm_v7");
  p.fwd.ranked = rank_algorithms(perf, got, tf32_.convolutions);
  if (p.fwd.ranked.empty()) fail(op, "cuDNN offers no usable forward algorithm for this shape");
  check_cudnn(
      cudnnGetConvolutionForwardWorkspaceSize(dnn_, p.x, p.w, p.conv, p.y, p.fwd.algo(), &p.fwd.ws),
      op, "cudnnGetConvolutionForwardWorkspaceSize");
  p.fwd.ready = true;
}

void cuda_backend_impl::choose_backward_data(conv_plan& p, const char* op) {
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

void cuda_backend_impl::choose_backward_filter(conv_plan& p, const char* op) {
  if (p.bwd_filter.ready) return;
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int got = 0;
  check_cudnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                  dnn_, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, perf),
              op, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
  p.bwd_filter.ranked = rank_algorithms(perf, got, tf32_.convolutions);
  if (p.bwd_filter.ranked.empty())
    fail(op, "cuDNN offers no usable backward-filter algorithm for this shape");
  check_cudnn(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, p.x, p.y, p.conv, p.w,
                                                             p.bwd_filter.algo(), &p.bwd_filter.ws),
              op, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
  p.bwd_filter.ready = true;
}

// Runs one direction with its chosen algorithm and workspace. An algorithm
// the heuristics offered may still refuse the shape at the call (PyTorch
// meets this too, and walks its list the same way): the next in the
// ranking takes over, for this call and the later ones.
template <class Algo, class WorkspaceOf, class Run>
void cuda_backend_impl::run_conv(algo_choice<Algo>& c, const char* op, const char* call,
                                 WorkspaceOf workspace_of, Run run) {
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

void cuda_backend_impl::conv2d_forward(const conv2d_shape& s, const float* x, const float* w,
                                       const float* b, float* y) {
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
        return cudnnConvolutionForward(dnn_, &one, p.x, in, p.w, w, p.conv, a, ws, ws_bytes, &zero,
                                       p.y, y);
      });
  // Not cudnnAddTensor: its generic kernel took ~4x as long.
  if (b) cuda::add_channel_bias(y, b, s.batch, s.out_channels, s.out_h() * s.out_w(), stream_);
}

void cuda_backend_impl::conv2d_backward(const conv2d_shape& s, const float* x, const float* w,
                                        const float* dy, float* dx, float* dw, float* db,
                                        bool accumulate) {
  const char* op = "conv2d_backward";
  if (s.batch == 0 || s.out_channels == 0) {
    // No positions: the parameter gradients are sums of nothing.
    if (!accumulate && dw && s.groups > 0)
      cuda::fill(dw, 0.0f,
                 elems(s.out_channels, s.in_channels / s.groups * s.kernel_h * s.kernel_w),
                 stream_);
    if (!accumulate && db) cuda::fill(db, 0.0f, static_cast<std::size_t>(s.out_channels), stream_);
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
    cuda::channel_bias_gradient(dy, s.batch, s.out_channels, s.out_h() * s.out_w(), db, accumulate,
                                bn_partials(s.batch, s.out_channels, s.out_h() * s.out_w(), op),
                                stream_);
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
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, p.x, p.y, p.conv, p.w, a, ws);
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
          return cudnnConvolutionBackwardData(dnn_, &one, p.w, w, p.y, dy, p.conv, a, ws, ws_bytes,
                                              &zero, p.x, out);
        });
    if (p.padded)
      cuda::crop_planes(out, dx, s.batch * s.in_channels, s.in_h, s.in_w, p.hp, p.wp, p.extra_top,
                        p.extra_left, stream_);
  }
}

}  // namespace troupe::kernels::cuda_backend_detail
