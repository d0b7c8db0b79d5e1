#pragma once
// troupe's own loops (everything that is not a matrix product), compiled once
// per instruction-set level (kernels/vector_kernels.inc, built three times
// with different -m flags) and chosen at run time by kernels/cpu_isa.hpp.
// The public entry points are kernels/cpu_kernels.hpp, which check their
// arguments and call the active table; tests reach every table directly.
//
// Every level computes the same IEEE operations in the same order per
// element (the ISA files are built with -ffp-contract=off: no FMA
// contraction), so the element-wise kernels give bit-identical results at
// every level; only the sums over many elements (reduce_sum) may round
// differently, as their lanes add in another order.
#include <cstddef>
#include <cstdint>

#include "kernels/activation.hpp"
#include "kernels/cpu_isa.hpp"

namespace troupe::kernels {

struct vector_kernels {
  cpu_isa isa;
  void (*relu_forward)(const float* x, float* y, std::size_t n);
  void (*relu_backward)(const float* y, const float* dy, float* dx, std::size_t n);
  void (*tanh_forward)(const float* x, float* y, std::size_t n);
  void (*tanh_backward)(const float* y, const float* dy, float* dx, std::size_t n);
  // dx[rows,cols] = act'(y) * dy (dx may alias dy), and the bias gradient of
  // the layer below in the same pass: db[j] (+)= sum over rows of dx[., j],
  // rows added in order. act none: dx = dy. db may be null.
  void (*activation_backward_bias)(activation act, const float* y, const float* dy, float* dx,
                                   float* db, int64_t rows, int64_t cols, bool accumulate);
  // db[j] (+)= sum over rows of dy[., j], rows added in order.
  void (*column_sums)(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate);
  // Labels already checked. Returns the loss sum; adds argmax hits to *hits.
  double (*softmax_cross_entropy)(const float* logits, const int32_t* labels, int64_t batch,
                                  int64_t classes, float grad_scale, float* dlogits, int64_t* hits);
  double (*reduce_sum)(const float* x, std::size_t n);
  float (*reduce_min)(const float* x, std::size_t n);  // n > 0
  float (*reduce_max)(const float* x, std::size_t n);  // n > 0
  void (*fill)(float* x, float v, std::size_t n);
  void (*add_inplace)(float* acc, const float* x, std::size_t n);
  void (*scale_inplace)(float* x, float s, std::size_t n);
  void (*min_inplace)(float* acc, const float* x, std::size_t n);
  void (*max_inplace)(float* acc, const float* x, std::size_t n);
  // dst = (src[0] + ... + src[m-1]) * scale (scale 1: a plain sum), summed in
  // source order per element; dst may be one of the sources.
  void (*sum_sources)(float* dst, const float* const* src, std::size_t m, std::size_t n,
                      float scale);
  // out[i] = table[src[i]]: a batch's pixels from the dataset's bytes.
  void (*decode_bytes)(const uint8_t* src, const float* table, float* out, std::size_t n);
  void (*sgd_step)(float* w, const float* g, std::size_t n, float lr, float wd);
  void (*momentum_step)(float* w, float* v, const float* g, std::size_t n, float lr, float mu,
                        bool nesterov, float wd);
  // step_size, inv_sqrt_bc2: this step's scalars (ew::adam_scalars_for). One
  // pass over the four arrays.
  void (*adam_step)(float* w, float* m, float* v, const float* g, std::size_t n, float lr, float b1,
                    float b2, float eps, float step_size, float inv_sqrt_bc2, float wd,
                    bool decoupled);
  void (*rmsprop_step)(float* w, float* ms, const float* g, std::size_t n, float lr, float rho,
                       float eps, float wd);
  void (*decoupled_decay_step)(float* w, std::size_t n, float lr, float wd);
};

// The table of one level, or null when this CPU cannot run it.
const vector_kernels* vector_kernels_for(cpu_isa isa);
// The table of active_isa().
const vector_kernels& active_vector_kernels();

}  // namespace troupe::kernels
