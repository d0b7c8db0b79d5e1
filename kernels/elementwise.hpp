#pragma once
// Element-wise math, written once and shared by the CPU kernels
// (kernels/cpu_kernels.cpp loops over these) and the CUDA kernels
// (kernels/cuda_kernels.cu calls the same functions per thread). Everything
// here must stay usable in nvcc device code: no std:: calls, no exceptions,
// only the C math functions (::sqrtf, ::expf) that CUDA also provides.
// Internal linkage (static): the per-ISA loop files (vector_kernels.inc) are
// compiled with different -m flags, and an inline function shared by name
// could be merged into a single AVX-512 copy that a baseline CPU then runs.
#include <math.h>

#if defined(__CUDACC__)
#define TROUPE_HD __host__ __device__
#else
#define TROUPE_HD
#endif

namespace troupe::kernels::ew {

TROUPE_HD static inline float sqrt_f(float x) {
  return ::sqrtf(x);
}
// tanh as a rational function (Eigen's generic_fast_tanh_float: a degree-13
// odd polynomial over a degree-6 even one, inputs clamped to +-7.905, where
// float's tanh is +-1; x itself below 4e-4). Why not ::tanhf: it is a libm
// call per element, which no loop vectorises; in the small RL policies
// (64x64 tanh MLPs) it took more of an actor's time than the matrix
// products. This is plain arithmetic: the per-ISA loops vectorise it, and
// CUDA runs the same formula. Checked over every 7th float bit pattern
// against double tanh: relative error <= 3.95e-7 (about 3 ulp), |y| <= 1,
// odd, exact 0 at 0, NaN stays NaN (tests/test_kernels.cpp).
TROUPE_HD static inline float tanh_f(float a) {
  const float c = 7.90531110763549805f;
  const float x = a < -c ? -c : (a > c ? c : a);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  const float r = p / q;
  return (a < 0.0004f && a > -0.0004f) ? a : r;
}
TROUPE_HD static inline float exp_f(float x) {
  return ::expf(x);
}
TROUPE_HD static inline float min_f(float a, float b) {
  return b < a ? b : a;
}
TROUPE_HD static inline float max_f(float a, float b) {
  return b > a ? b : a;
}

// ---- activations ---------------------------------------------------------

TROUPE_HD static inline float relu(float x) {
  return x > 0.0f ? x : 0.0f;
}
// y is the forward output; the gradient passes where the unit was active.
TROUPE_HD static inline float relu_grad(float y, float dy) {
  return y > 0.0f ? dy : 0.0f;
}

TROUPE_HD static inline float tanh_act(float x) {
  return tanh_f(x);
}
// y is the forward output: d tanh(x)/dx = 1 - tanh(x)^2.
TROUPE_HD static inline float tanh_grad(float y, float dy) {
  return dy * (1.0f - y * y);
}

// leaky_relu: slope alpha below 0. The gradient takes the input's sign (the
// output's is the same for alpha > 0; relu_grad likewise takes either).
TROUPE_HD static inline float leaky_relu(float x, float alpha) {
  return x > 0.0f ? x : alpha * x;
}
TROUPE_HD static inline float leaky_relu_grad(float x, float alpha, float dy) {
  return x > 0.0f ? dy : alpha * dy;
}

// The exact GELU, x * Phi(x) with Phi the standard normal CDF (PyTorch's
// default, not the tanh approximation).
TROUPE_HD static inline float gelu(float x) {
  return 0.5f * x * (1.0f + ::erff(x * 0.70710678118654752f));
}
// x is the forward input: d/dx = Phi(x) + x * phi(x).
TROUPE_HD static inline float gelu_grad(float x, float dy) {
  const float cdf = 0.5f * (1.0f + ::erff(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * ::expf(-0.5f * x * x);
  return dy * (cdf + x * pdf);
}

// exp of a non-positive argument only: no overflow for any x.
TROUPE_HD static inline float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + ::expf(-x));
  const float e = ::expf(x);
  return e / (1.0f + e);
}
// y is the forward output.
TROUPE_HD static inline float sigmoid_grad(float y, float dy) {
  return dy * y * (1.0f - y);
}

// ---- binary cross-entropy on a logit z against a target t in [0, 1] ----------

// max(z,0) - z*t + log(1 + exp(-|z|)) in double: no overflow for any z,
// and log1p keeps the small tail term accurate.
TROUPE_HD static inline double bce_loss(float z, float t) {
  const double zd = z, td = t;
  return (zd > 0.0 ? zd : 0.0) - zd * td + ::log1p(::exp(zd < 0.0 ? zd : -zd));
}
TROUPE_HD static inline float bce_dlogit(float z, float t, float grad_scale) {
  return (sigmoid(z) - t) * grad_scale;
}
// Whether sigmoid(z) is on t's side of 0.5 (0.5 itself counts as the lower
// side on both, as the CUDA kernel counts).
TROUPE_HD static inline bool bce_correct(float z, float t) {
  return (z > 0.0f) == (t > 0.5f);
}

// ---- softmax cross-entropy (one row: max mx, sum_exp = sum_j exp(l_j - mx)) ----

// The row's term of the loss sum: log(sum_j exp(l_j)) - l_label
// = mx + log(sum_exp) - l_label, in double.
TROUPE_HD static inline double ce_row_loss(float mx, double sum_exp, float label_logit) {
  return static_cast<double>(mx) + ::log(sum_exp) - static_cast<double>(label_logit);
}
// softmax_j * grad_scale with inv_sum = 1 / sum_exp; the label's entry then
// has grad_scale subtracted.
TROUPE_HD static inline float ce_dlogit(float logit, float mx, float inv_sum, float grad_scale) {
  return exp_f(logit - mx) * inv_sum * grad_scale;
}

// ---- optimizer updates (one element) ----------------------------------------

// L2 weight decay: added to the gradient.
TROUPE_HD static inline float l2_grad(float g, float w, float weight_decay) {
  return g + weight_decay * w;
}

// Decoupled weight decay (AdamW): w -= lr * wd * w, independent of the gradient.
TROUPE_HD static inline void decoupled_decay(float& w, float lr, float weight_decay) {
  w -= lr * weight_decay * w;
}

// g' = g + wd*w; w -= lr*g'
TROUPE_HD static inline void sgd_update(float& w, float g, float lr, float weight_decay) {
  const float gd = l2_grad(g, w, weight_decay);
  w -= lr * gd;
}

// g' = g + wd*w; v = mu*v + g'; w -= lr*v   (nesterov: w -= lr*(g' + mu*v))
TROUPE_HD static inline void momentum_update(float& w, float& v, float g, float lr, float mu,
                                             bool nesterov, float weight_decay) {
  const float gd = l2_grad(g, w, weight_decay);
  v = mu * v + gd;
  const float step = nesterov ? gd + mu * v : v;
  w -= lr * step;
}

// adam_update's per-step scalars (host code), from the 1-based step t (in double, once
// a step): step_size = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t).
struct adam_scalars {
  float step_size;
  float inv_sqrt_bc2;
};
static inline adam_scalars adam_scalars_for(float lr, float b1, float b2, long long step) {
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - ::pow(static_cast<double>(b1), t);
  const double bc2 = 1.0 - ::pow(static_cast<double>(b2), t);
  return {static_cast<float>(static_cast<double>(lr) / bc1), static_cast<float>(1.0 / ::sqrt(bc2))};
}

// m = b1*m + (1-b1)g; v = b2*v + (1-b2)g^2; mhat = m/bc1; vhat = v/bc2;
// w -= lr * mhat / (sqrt(vhat) + eps), where bc1 = 1 - b1^t and bc2 = 1 - b2^t
// are the bias corrections for the 1-based step t. Computed as
// w -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps) with the scalars of
// adam_scalars_for (step_size = lr/bc1, inv_sqrt_bc2 = 1/sqrt(bc2)), as
// PyTorch's Adam does: one division and one square root an element instead
// of three divisions and a root. Both share one divider on x86 cores (~10
// cycles a 16-float vector each), which bounded the update there (0.27 ms
// for the MLP's 269k parameters on a Xeon, model 207). Weight decay: L2 on
// the gradient, or decoupled (AdamW: w -= lr*wd*w with the weight before
// this update).
TROUPE_HD static inline void adam_update(float& w, float& m, float& v, float g, float lr, float b1,
                                         float b2, float eps, float step_size, float inv_sqrt_bc2,
                                         float weight_decay, bool decoupled) {
  const float w0 = w;
  const float gd = decoupled ? g : l2_grad(g, w0, weight_decay);
  m = b1 * m + (1.0f - b1) * gd;
  v = b2 * v + (1.0f - b2) * gd * gd;
  float nw = w0 - step_size * m / (sqrt_f(v) * inv_sqrt_bc2 + eps);
  if (decoupled) nw -= lr * weight_decay * w0;
  w = nw;
}

// g' = g + wd*w; ms = rho*ms + (1-rho)g'^2; w -= lr * g' / (sqrt(ms) + eps)
TROUPE_HD static inline void rmsprop_update(float& w, float& ms, float g, float lr, float rho,
                                            float eps, float weight_decay) {
  const float gd = l2_grad(g, w, weight_decay);
  ms = rho * ms + (1.0f - rho) * gd * gd;
  w -= lr * gd / (sqrt_f(ms) + eps);
}

}  // namespace troupe::kernels::ew
