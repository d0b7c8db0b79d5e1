// The loops of kernels/vector_kernels.inc for the baseline level (flags in
// kernels/CMakeLists.txt).
#define TROUPE_VK_NS vk_baseline
#define TROUPE_VK_ISA cpu_isa::baseline
#include "kernels/vector_kernels.inc"
