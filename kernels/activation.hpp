#pragma once
#include <cstdint>

namespace troupe::kernels {

// The activation after a dense layer: fused into the product where the
// device allows it (oneDNN post-ops on the CPU), and its gradient into the
// backward's bias gradient.
enum class activation : uint8_t { none, relu, tanh };

}  // namespace troupe::kernels
