#include "kernels/vector_kernels.hpp"

namespace troupe::kernels {

namespace vk_baseline {
const vector_kernels& table();
}
namespace vk_avx2 {
const vector_kernels& table();
}
namespace vk_avx512 {
const vector_kernels& table();
}

const vector_kernels* vector_kernels_for(cpu_isa isa) {
  if (!cpu_supports(isa)) return nullptr;
  switch (isa) {
    case cpu_isa::baseline:
      return &vk_baseline::table();
    case cpu_isa::avx2:
      return &vk_avx2::table();
    case cpu_isa::avx512:
      break;
  }
  return &vk_avx512::table();
}

const vector_kernels& active_vector_kernels() {
  static const vector_kernels* const t = vector_kernels_for(active_isa());
  return *t;
}

}  // namespace troupe::kernels
