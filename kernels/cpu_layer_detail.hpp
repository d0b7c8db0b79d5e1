#pragma once
// What the CPU layer files share (kernels/cpu_layers.cpp: point-wise,
// normalisation, dropout, embedding, losses; kernels/cpu_conv_pool.cpp:
// convolution and pooling): the target attributes their per-level loops are
// built with (picked by active_isa(), kernels/cpu_isa.hpp, as the vector
// loops are), and two small helpers. Not for use outside kernels/.
#include <cstddef>
#include <cstdint>
#include <cstring>

#define TROUPE_AVX2 __attribute__((target("avx2,fma")))
#define TROUPE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))

namespace troupe::kernels::cpu::layer_detail {

inline std::size_t sz(int64_t n) {
  return static_cast<std::size_t>(n);
}

inline void zero(float* p, std::size_t n) {
  if (n > 0) std::memset(p, 0, n * sizeof(float));
}

}  // namespace troupe::kernels::cpu::layer_detail
