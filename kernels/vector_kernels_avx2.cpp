// The loops of kernels/vector_kernels.inc for the avx2 level (flags in
// kernels/CMakeLists.txt).
#define TROUPE_VK_NS vk_avx2
#define TROUPE_VK_ISA cpu_isa::avx2
#include "kernels/vector_kernels.inc"
