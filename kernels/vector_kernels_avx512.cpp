// The loops of kernels/vector_kernels.inc for the avx512 level (flags in
// kernels/CMakeLists.txt).
#define TROUPE_VK_NS vk_avx512
#define TROUPE_VK_ISA cpu_isa::avx512
#include "kernels/vector_kernels.inc"
