// The layers of convolutional nets on the CUDA path (kernels/cuda_layers.hpp),
// all on NCHW planes and their channels: the zero padding around cuDNN's
// convolutions, the convolution's bias and its gradient, pooling, batch norm.
// Its own file because these share the per-channel partial sums in double
// and the 32-bit index variants, which nothing over [rows, cols] needs; the
// row-wise layers (activations, layer norm, dropout, embeddings, losses) are
// kernels/cuda_row_layers.cu, the convolutions themselves cuDNN's
// (kernels/cuda_backend_conv.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda_launch.hpp"
#include "kernels/cuda_layers.hpp"
#include "kernels/elementwise.hpp"

namespace troupe::kernels::cuda {

using namespace launch_detail;

namespace {

// Sums v over the block (blockDim.x == threads_per_block) in a fixed order;
// the result is valid in thread 0.
__device__ inline double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = threads_per_block / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double r = shared[0];
  __syncthreads();  // the buffer may be reused at once
  return r;
}

// ---- padding ----------------------------------------------------------------

__global__ void pad_kernel(const float* x, float* xp, std::size_t total, int64_t h, int64_t w,
                           int64_t hp, int64_t wp, int64_t top, int64_t left) {
  TROUPE_GRID_LOOP(i, total) {
    const int64_t c = static_cast<int64_t>(i % static_cast<std::size_t>(wp));
    const int64_t t = static_cast<int64_t>(i / static_cast<std::size_t>(wp));
    const int64_t r = t % hp, p = t / hp;
    const int64_t ih = r - top, iw = c - left;
    xp[i] = (ih >= 0 && ih < h && iw >= 0 && iw < w) ? x[(p * h + ih) * w + iw] : 0.0f;
  }
}

__global__ void crop_kernel(const float* xp, float* x, std::size_t total, int64_t h, int64_t w,
                            int64_t hp, int64_t wp, int64_t top, int64_t left) {
  TROUPE_GRID_LOOP(i, total) {
    const int64_t c = static_cast<int64_t>(i % static_cast<std::size_t>(w));
    const int64_t t = static_cast<int64_t>(i / static_cast<std::size_t>(w));
    const int64_t r = t % h, p = t / h;
    x[i] = xp[(p * hp + r + top) * wp + c + left];
  }
}

// ---- pooling ----------------------------------------------------------------

// I: the index type (int32_t where every index fits, see pool_fits_32).
template <class I>
struct pool_dims {
  I h, w, oh, ow, kh, kw, sh, sw, pt, pl;
};

template <class I>
__global__ void pool_forward_kernel(pool_dims<I> d, bool is_max, const float* x, float* y,
                                    int32_t* argmax, I total) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    const I ow = i % d.ow;
    const I t = i / d.ow;
    const I oh = t % d.oh, p = t / d.oh;
    const float* xp = x + static_cast<int64_t>(p) * d.h * d.w;
    const I h0 = oh * d.sh - d.pt, w0 = ow * d.sw - d.pl;
    const I hb = h0 < 0 ? 0 : h0, he = h0 + d.kh < d.h ? h0 + d.kh : d.h;
    const I wb = w0 < 0 ? 0 : w0, we = w0 + d.kw < d.w ? w0 + d.kw : d.w;
    if (is_max) {
      // Row-major scan with a strict comparison: the first largest wins.
      float best = 0.0f;
      I arg = -1;
      for (I ih = hb; ih < he; ++ih)
        for (I iw = wb; iw < we; ++iw) {
          const float v = xp[ih * d.w + iw];
          if (arg < 0 || v > best) {
            best = v;
            arg = ih * d.w + iw;
          }
        }
      y[i] = best;
      if (argmax) argmax[i] = static_cast<int32_t>(arg);
    } else {
      float sum = 0.0f;
      for (I ih = hb; ih < he; ++ih)
        for (I iw = wb; iw < we; ++iw) sum += xp[ih * d.w + iw];
      const I count = (he - hb) * (we - wb);
      y[i] = count > 0 ? sum / static_cast<float>(count) : 0.0f;
    }
  }
}

// Windows that tile the input (stride = window, no padding): each input
// position lies in at most one window, found by one division.
template <class I>
__global__ void pool_backward_tiled_kernel(pool_dims<I> d, bool is_max, const float* dy, float* dx,
                                           const int32_t* argmax, I total) {
  const float inv_area = 1.0f / static_cast<float>(d.kh * d.kw);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    const I iw = i % d.w;
    const I t = i / d.w;
    const I ih = t % d.h, p = t / d.h;
    const I oh = ih / d.kh, ow = iw / d.kw;
    float g = 0.0f;
    if (oh < d.oh && ow < d.ow) {
      const int64_t o = (static_cast<int64_t>(p) * d.oh + oh) * d.ow + ow;
      if (is_max)
        g = argmax[o] == static_cast<int32_t>(ih * d.w + iw) ? dy[o] : 0.0f;
      else
        g = dy[o] * inv_area;
    }
    dx[i] = g;
  }
}

template <class I>
__global__ void pool_backward_kernel(pool_dims<I> d, bool is_max, const float* dy, float* dx,
                                     const int32_t* argmax, I total) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    const I iw = i % d.w;
    const I t = i / d.w;
    const I ih = t % d.h, p = t / d.h;
    // The windows covering (ih, iw): oh * sh - pt <= ih <= oh * sh - pt + kh - 1.
    const I lo_h = ih + d.pt - d.kh + 1, lo_w = iw + d.pl - d.kw + 1;
    const I ohb = lo_h <= 0 ? 0 : (lo_h + d.sh - 1) / d.sh;
    const I owb = lo_w <= 0 ? 0 : (lo_w + d.sw - 1) / d.sw;
    I ohe = (ih + d.pt) / d.sh + 1, owe = (iw + d.pl) / d.sw + 1;
    if (ohe > d.oh) ohe = d.oh;
    if (owe > d.ow) owe = d.ow;
    const int64_t plane = static_cast<int64_t>(p) * d.oh * d.ow;
    const int32_t me = static_cast<int32_t>(ih * d.w + iw);
    float g = 0.0f;
    for (I oh = ohb; oh < ohe; ++oh)
      for (I ow = owb; ow < owe; ++ow) {
        const int64_t o = plane + oh * d.ow + ow;
        if (is_max) {
          if (argmax[o] == me) g += dy[o];
        } else {
          const I h0 = oh * d.sh - d.pt, w0 = ow * d.sw - d.pl;
          const I hb = h0 < 0 ? 0 : h0, he = h0 + d.kh < d.h ? h0 + d.kh : d.h;
          const I wb = w0 < 0 ? 0 : w0, we = w0 + d.kw < d.w ? w0 + d.kw : d.w;
          g += dy[o] / static_cast<float>((he - hb) * (we - wb));
        }
      }
    dx[i] = g;
  }
}

// ---- batch norm -------------------------------------------------------------

// Block (s, c) sums a(k) and b(k) over the s-th of `splits` equal runs of
// channel c's batch * spatial positions, in double, in a fixed order, into
// partials[(c * splits + s) * 2 + {0, 1}]; bn_finish_sums_kernel adds the
// runs in order. Several blocks a channel keep every multiprocessor busy
// where a layer has few channels and large planes.
__global__ void bn_partial_sums_kernel(const float* x, const float* dy, const float* mean,
                                       const float* invstd, int64_t batch, int64_t channels,
                                       int64_t spatial, int64_t splits, double* partials) {
  __shared__ double buf[threads_per_block];
  const int64_t c = blockIdx.y, s = blockIdx.x;
  const int64_t per = batch * spatial;
  const int64_t end = per * (s + 1) / splits;
  double s0 = 0.0, s1 = 0.0;
  const float m = dy ? mean[c] : 0.0f, is = dy ? invstd[c] : 0.0f;
  int64_t k = per * s / splits + threadIdx.x;
  // (n, p) of position k, divided once and then carried along.
  int64_t n = k / spatial, p = k % spatial;
  for (; k < end; k += threads_per_block) {
    const int64_t at = (n * channels + c) * spatial + p;
    p += threads_per_block;
    while (p >= spatial) {
      p -= spatial;
      ++n;
    }
    const float v = x[at];
    if (dy) {
      // Backward: sum dy and sum dy * xhat.
      const float g = dy[at];
      s0 += static_cast<double>(g);
      s1 += static_cast<double>(g) * static_cast<double>((v - m) * is);
    } else {
      s0 += static_cast<double>(v);
      s1 += static_cast<double>(v) * static_cast<double>(v);
    }
  }
  s0 = block_sum(s0, buf);
  s1 = block_sum(s1, buf);
  if (threadIdx.x == 0) {
    partials[(c * splits + s) * 2] = s0;
    partials[(c * splits + s) * 2 + 1] = s1;
  }
}

// A convolution's bias gradient: channel c's sum of dy (the partial sums'
// first half), added to db when accumulating.
__global__ void channel_bias_finish_kernel(const double* partials, int64_t channels, int64_t splits,
                                           float* db, bool accumulate) {
  TROUPE_GRID_LOOP(c, static_cast<std::size_t>(channels)) {
    double s0 = 0.0;
    for (int64_t s = 0; s < splits; ++s) s0 += partials[(static_cast<int64_t>(c) * splits + s) * 2];
    db[c] = (accumulate ? db[c] : 0.0f) + static_cast<float>(s0);
  }
}

template <class I>
__global__ void add_channel_bias_kernel(float* y, const float* b, I total, I channels, I spatial) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x)
    y[i] += b[i / spatial % channels];
}

__global__ void bn_finish_sums_kernel(const double* partials, int64_t channels, int64_t splits,
                                      float* sums) {
  TROUPE_GRID_LOOP(c, static_cast<std::size_t>(channels)) {
    double s0 = 0.0, s1 = 0.0;
    for (int64_t s = 0; s < splits; ++s) {
      s0 += partials[(static_cast<int64_t>(c) * splits + s) * 2];
      s1 += partials[(static_cast<int64_t>(c) * splits + s) * 2 + 1];
    }
    sums[c] = static_cast<float>(s0);
    sums[channels + c] = static_cast<float>(s1);
  }
}

__global__ void bn_statistics_kernel(const float* sums, int64_t channels, double count, float eps,
                                     float momentum, float* mean, float* invstd,
                                     float* running_mean, float* running_var) {
  TROUPE_GRID_LOOP(i, static_cast<std::size_t>(channels)) {
    const double m = static_cast<double>(sums[i]) / count;
    double var = static_cast<double>(sums[channels + i]) / count - m * m;
    if (var < 0.0) var = 0.0;
    mean[i] = static_cast<float>(m);
    invstd[i] = 1.0f / ew::sqrt_f(static_cast<float>(var) + eps);
    if (running_mean)
      running_mean[i] = (1.0f - momentum) * running_mean[i] + momentum * static_cast<float>(m);
    if (running_var) {
      const double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
      running_var[i] = (1.0f - momentum) * running_var[i] + momentum * static_cast<float>(unbiased);
    }
  }
}

__global__ void invstd_kernel(const float* var, float eps, float* invstd, std::size_t n) {
  TROUPE_GRID_LOOP(i, n) invstd[i] = 1.0f / ew::sqrt_f(var[i] + eps);
}

// I: the index type, 32 bits where the tensor allows (a 64-bit division
// costs several times a 32-bit one, once an element).
template <class I>
__global__ void bn_forward_kernel(const float* x, const float* mean, const float* invstd,
                                  const float* gamma, const float* beta, float* y, I total,
                                  I channels, I spatial) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    const I c = i / spatial % channels;
    const float g = gamma ? gamma[c] : 1.0f, b = beta ? beta[c] : 0.0f;
    y[i] = (x[i] - mean[c]) * invstd[c] * g + b;
  }
}

template <class I>
__global__ void bn_backward_kernel(const float* x, const float* dy, const float* mean,
                                   const float* invstd, const float* gamma, const float* sums,
                                   float inv_count, float* dx, I total, I channels, I spatial) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    const I c = i / spatial % channels;
    const float is = invstd[c], g = gamma ? gamma[c] : 1.0f;
    const float xhat = (x[i] - mean[c]) * is;
    dx[i] = g * is * (dy[i] - sums[c] * inv_count - xhat * sums[channels + c] * inv_count);
  }
}

template <class I>
pool_dims<I> dims_of(const pool2d_shape& s) {
  const auto i = [](int64_t v) { return static_cast<I>(v); };
  return pool_dims<I>{i(s.in_h),     i(s.in_w),     i(s.out_h()),  i(s.out_w()), i(s.kernel_h),
                      i(s.kernel_w), i(s.stride_h), i(s.stride_w), i(s.pad_top), i(s.pad_left)};
}

// Whether every index of a pooling (elements of the input and output,
// window corners with their padding) fits in 32 bits.
bool pool_fits_32(const pool2d_shape& s) {
  constexpr int64_t most = 0x3fffffff;  // room for the sums of two indices
  const int64_t planes = s.batch * s.channels;
  return planes * s.in_h * s.in_w <= most && planes * s.out_h() * s.out_w() <= most &&
         s.in_h + s.pad_top + s.pad_bottom + s.kernel_h <= most &&
         s.in_w + s.pad_left + s.pad_right + s.kernel_w <= most && s.out_h() * s.stride_h <= most &&
         s.out_w() * s.stride_w <= most;
}

// 32-bit element indices where the tensor allows.
bool fits_32(std::size_t total) {
  return total <= 0x7fffffffu;
}

void check_pool(const pool2d_shape& s, const char* op) {
  check_dims(
      op, {s.batch, s.channels, s.in_h, s.in_w, s.pad_top, s.pad_left, s.pad_bottom, s.pad_right});
  if (s.kernel_h < 1 || s.kernel_w < 1 || s.stride_h < 1 || s.stride_w < 1 ||
      (s.batch > 0 && s.channels > 0 && (s.out_h() < 1 || s.out_w() < 1)))
    throw std::invalid_argument(std::string("cuda ") + op + ": invalid pooling shape");
  if (s.in_h * s.in_w > 0x7fffffff)
    throw std::invalid_argument(std::string("cuda ") + op +
                                ": an input plane of more than 2^31 elements");
}

}  // namespace

void pad_planes(const float* x, float* xp, int64_t planes, int64_t h, int64_t w, int64_t hp,
                int64_t wp, int64_t top, int64_t left, cudaStream_t stream) {
  const std::size_t total = prod(planes, hp * wp);
  if (total == 0) return;
  pad_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(x, xp, total, h, w, hp, wp, top,
                                                                  left);
  check_launch("pad_planes");
}

void crop_planes(const float* xp, float* x, int64_t planes, int64_t h, int64_t w, int64_t hp,
                 int64_t wp, int64_t top, int64_t left, cudaStream_t stream) {
  const std::size_t total = prod(planes, h * w);
  if (total == 0) return;
  crop_kernel<<<blocks_for(total), threads_per_block, 0, stream>>>(xp, x, total, h, w, hp, wp, top,
                                                                   left);
  check_launch("crop_planes");
}

void pool2d_forward(const pool2d_shape& s, const float* x, float* y, int32_t* argmax,
                    cudaStream_t stream) {
  check_pool(s, "pool2d_forward");
  const std::size_t total = prod(s.batch * s.channels, s.out_h() * s.out_w());
  if (total == 0) return;
  const bool is_max = s.kind == pool_kind::max;
  int32_t* arg = is_max ? argmax : nullptr;
  if (pool_fits_32(s))
    pool_forward_kernel<int32_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        dims_of<int32_t>(s), is_max, x, y, arg, static_cast<int32_t>(total));
  else
    pool_forward_kernel<int64_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        dims_of<int64_t>(s), is_max, x, y, arg, static_cast<int64_t>(total));
  check_launch("pool2d_forward");
}

void pool2d_backward(const pool2d_shape& s, const float* dy, float* dx, const int32_t* argmax,
                     cudaStream_t stream) {
  check_pool(s, "pool2d_backward");
  if (s.kind == pool_kind::max && !argmax)
    throw std::invalid_argument(
        "cuda pool2d_backward: max pooling needs the forward's workspace (null given)");
  const std::size_t total = prod(s.batch * s.channels, s.in_h * s.in_w);
  if (total == 0) return;
  const bool is_max = s.kind == pool_kind::max;
  const bool tiled = s.stride_h == s.kernel_h && s.stride_w == s.kernel_w && s.pad_top == 0 &&
                     s.pad_left == 0 && s.pad_bottom == 0 && s.pad_right == 0;
  if (tiled && pool_fits_32(s))
    pool_backward_tiled_kernel<int32_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        dims_of<int32_t>(s), is_max, dy, dx, argmax, static_cast<int32_t>(total));
  else if (pool_fits_32(s))
    pool_backward_kernel<int32_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        dims_of<int32_t>(s), is_max, dy, dx, argmax, static_cast<int32_t>(total));
  else
    pool_backward_kernel<int64_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        dims_of<int64_t>(s), is_max, dy, dx, argmax, static_cast<int64_t>(total));
  check_launch("pool2d_backward");
}

int64_t batch_norm_splits(int64_t batch, int64_t channels, int64_t spatial) {
  // About eight blocks a multiprocessor of a large GPU in all (a block's
  // loads wait on memory: many in flight hide it), each over at least 2048
  // positions; a fixed function of the shape, so the sums' order (and their
  // rounding) is the same at every call.
  constexpr int64_t least_per_block = 2048;
  if (channels <= 0) return 1;
  const int64_t by_blocks = (channel_sum_blocks + channels - 1) / channels;
  const int64_t by_size = batch * spatial / least_per_block;
  return std::max<int64_t>(1, std::min<int64_t>(std::min(by_blocks, by_size), 65535));
}

namespace {

void launch_bn_sums(const char* op, const float* x, const float* dy, const float* mean,
                    const float* invstd, int64_t batch, int64_t channels, int64_t spatial,
                    float* sums, double* partials, cudaStream_t stream) {
  check_dims(op, {batch, channels, spatial});
  if (channels == 0) return;
  if (channels > 65535)
    throw std::invalid_argument(std::string("cuda ") + op + ": too many channels");
  const int64_t splits = batch_norm_splits(batch, channels, spatial);
  bn_partial_sums_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(channels)),
                           threads_per_block, 0, stream>>>(x, dy, mean, invstd, batch, channels,
                                                           spatial, splits, partials);
  check_launch(op);
  bn_finish_sums_kernel<<<blocks_for(static_cast<std::size_t>(channels)), threads_per_block, 0,
                          stream>>>(partials, channels, splits, sums);
  check_launch(op);
}

}  // namespace

void channel_bias_gradient(const float* dy, int64_t batch, int64_t channels, int64_t spatial,
                           float* db, bool accumulate, double* partials, cudaStream_t stream) {
  check_dims("channel_bias_gradient", {batch, channels, spatial});
  if (channels == 0) return;
  if (channels > 65535)
    throw std::invalid_argument("cuda channel_bias_gradient: too many channels");
  const int64_t splits = batch_norm_splits(batch, channels, spatial);
  bn_partial_sums_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(channels)),
                           threads_per_block, 0, stream>>>(dy, nullptr, nullptr, nullptr, batch,
                                                           channels, spatial, splits, partials);
  check_launch("channel_bias_gradient");
  channel_bias_finish_kernel<<<blocks_for(static_cast<std::size_t>(channels)), threads_per_block, 0,
                               stream>>>(partials, channels, splits, db, accumulate);
  check_launch("channel_bias_gradient");
}

void add_channel_bias(float* y, const float* b, int64_t batch, int64_t channels, int64_t spatial,
                      cudaStream_t stream) {
  check_dims("add_channel_bias", {batch, channels, spatial});
  const std::size_t total = prod(batch * channels, spatial);
  if (total == 0) return;
  if (fits_32(total))
    add_channel_bias_kernel<uint32_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        y, b, static_cast<uint32_t>(total), static_cast<uint32_t>(channels),
        static_cast<uint32_t>(spatial));
  else
    add_channel_bias_kernel<std::size_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        y, b, total, static_cast<std::size_t>(channels), static_cast<std::size_t>(spatial));
  check_launch("add_channel_bias");
}

void batch_norm_sums(const float* x, int64_t batch, int64_t channels, int64_t spatial, float* sums,
                     double* partials, cudaStream_t stream) {
  launch_bn_sums("batch_norm_sums", x, nullptr, nullptr, nullptr, batch, channels, spatial, sums,
                 partials, stream);
}

void batch_norm_statistics(const float* sums, int64_t channels, double count, float eps,
                           float momentum, float* mean, float* invstd, float* running_mean,
                           float* running_var, cudaStream_t stream) {
  check_dims("batch_norm_statistics", {channels});
  if (!(count > 0.0))
    throw std::invalid_argument("cuda batch_norm_statistics: count " + std::to_string(count));
  if (channels == 0) return;
  const std::size_t n = static_cast<std::size_t>(channels);
  bn_statistics_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(
      sums, channels, count, eps, momentum, mean, invstd, running_mean, running_var);
  check_launch("batch_norm_statistics");
}

void invstd_from_variance(const float* var, float eps, float* invstd, std::size_t n,
                          cudaStream_t stream) {
  if (n == 0) return;
  invstd_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(var, eps, invstd, n);
  check_launch("invstd_from_variance");
}

void batch_norm_forward(const float* x, const float* mean, const float* invstd, const float* gamma,
                        const float* beta, float* y, int64_t batch, int64_t channels,
                        int64_t spatial, cudaStream_t stream) {
  check_dims("batch_norm_forward", {batch, channels, spatial});
  const std::size_t total = prod(batch * channels, spatial);
  if (total == 0) return;
  if (fits_32(total))
    bn_forward_kernel<uint32_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        x, mean, invstd, gamma, beta, y, static_cast<uint32_t>(total),
        static_cast<uint32_t>(channels), static_cast<uint32_t>(spatial));
  else
    bn_forward_kernel<std::size_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        x, mean, invstd, gamma, beta, y, total, static_cast<std::size_t>(channels),
        static_cast<std::size_t>(spatial));
  check_launch("batch_norm_forward");
}

void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                              const float* invstd, int64_t batch, int64_t channels, int64_t spatial,
                              float* sums, double* partials, cudaStream_t stream) {
  launch_bn_sums("batch_norm_backward_sums", x, dy, mean, invstd, batch, channels, spatial, sums,
                 partials, stream);
}

void batch_norm_backward(const float* x, const float* dy, const float* mean, const float* invstd,
                         const float* gamma, const float* sums, double count, float* dx,
                         int64_t batch, int64_t channels, int64_t spatial, cudaStream_t stream) {
  check_dims("batch_norm_backward", {batch, channels, spatial});
  if (!(count > 0.0))
    throw std::invalid_argument("cuda batch_norm_backward: count " + std::to_string(count));
  const std::size_t total = prod(batch * channels, spatial);
  if (total == 0) return;
  const float inv_count = static_cast<float>(1.0 / count);
  if (fits_32(total))
    bn_backward_kernel<uint32_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        x, dy, mean, invstd, gamma, sums, inv_count, dx, static_cast<uint32_t>(total),
        static_cast<uint32_t>(channels), static_cast<uint32_t>(spatial));
  else
    bn_backward_kernel<std::size_t><<<blocks_for(total), threads_per_block, 0, stream>>>(
        x, dy, mean, invstd, gamma, sums, inv_count, dx, total, static_cast<std::size_t>(channels),
        static_cast<std::size_t>(spatial));
  check_launch("batch_norm_backward");
}

}  // namespace troupe::kernels::cuda
