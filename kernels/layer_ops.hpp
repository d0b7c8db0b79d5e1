#pragma once
// The shapes and shared math of the layer operations of kernels/backend.hpp
// (convolution, pooling, normalisation, point-wise functions, dropout,
// embedding, the regression and binary losses). Tensors are float32,
// row-major, images channels first: x[batch, channels, height, width]
// ("NCHW", what IDX images and PyTorch give); a dense input [batch, f] is an
// image of f channels and 1 x 1 pixels where a layer needs one.
//
// Everything here is usable in nvcc device code (see kernels/elementwise.hpp).
#include <stdint.h>

#include "kernels/elementwise.hpp"

namespace troupe::kernels {

// y[n, co, oh, ow] = b[co] + sum over (ci in co's group, kh, kw) of
//   w[co, ci, kh, kw] * x[n, g*cin_g + ci, oh*stride_h - pad_top + kh*dilation_h,
//                                        ow*stride_w - pad_left + kw*dilation_w]
// (positions outside the image read 0). w: [out_channels,
// in_channels / groups, kernel_h, kernel_w]; b: [out_channels] or null.
// dilation 1 is a dense kernel (PyTorch's convention, not oneDNN's 0).
struct conv2d_shape {
  int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int64_t out_channels = 0, kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t groups = 1;

  TROUPE_HD int64_t out_h() const {
    return (in_h + pad_top + pad_bottom - dilation_h * (kernel_h - 1) - 1) / stride_h + 1;
  }
  TROUPE_HD int64_t out_w() const {
    return (in_w + pad_left + pad_right - dilation_w * (kernel_w - 1) - 1) / stride_w + 1;
  }
};

enum class pool_kind : uint8_t { max, avg };

// Max: y is the largest input in the window (padding never wins); its
// gradient goes to the first largest (row-major order in the window). Avg:
// the mean over the window's positions inside the image (padding excluded,
// as Keras and oneDNN's avg_exclude_padding; PyTorch's
// count_include_pad=False).
struct pool2d_shape {
  pool_kind kind = pool_kind::max;
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;

  TROUPE_HD int64_t out_h() const {
    return (in_h + pad_top + pad_bottom - kernel_h) / stride_h + 1;
  }
  TROUPE_HD int64_t out_w() const {
    return (in_w + pad_left + pad_right - kernel_w) / stride_w + 1;
  }
};

// Point-wise functions: relu, leaky_relu (alpha: the slope below 0), gelu
// (the exact one, x * Phi(x) with erf, PyTorch's default), tanh, sigmoid.
enum class unary_op : uint8_t { relu, leaky_relu, gelu, tanh, sigmoid };

// ---- dropout ---------------------------------------------------------------
// The mask of element j of an example is a function of (seed, example id, j)
// only, the same on every device, so a replica holding any slice of the
// global batch draws what one device drawing the whole batch draws. The
// caller folds the job seed, the layer and the step into `seed`.

TROUPE_HD static inline uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// True when element j of example `id` is kept; rate in [0, 1).
// derive_seed (models/random.hpp: one splitmix64 draw from seed ^ a
// multiple of stream + 1), usable on the device.
TROUPE_HD static inline uint64_t derive_seed_hd(uint64_t seed, uint64_t stream) {
  uint64_t z = (seed ^ (0xD1B54A32D192ED03ULL * (stream + 1))) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The seed of a dropout layer's masks at a step: the layer's stream of the
// step's stream of the model's base seed.
TROUPE_HD static inline uint64_t dropout_step_seed(uint64_t base, int64_t step, uint64_t layer) {
  return derive_seed_hd(derive_seed_hd(base, static_cast<uint64_t>(step)), layer);
}

TROUPE_HD static inline bool dropout_keep(uint64_t seed, int64_t id, int64_t j, float rate) {
  uint64_t h = dropout_mix(seed ^ dropout_mix(static_cast<uint64_t>(id) * 0x9e3779b97f4a7c15ULL +
                                              static_cast<uint64_t>(j)));
  // 24 random bits: a float in [0, 1) without rounding up to 1.
  float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return u >= rate;
}

}  // namespace troupe::kernels
