#pragma once
// CRC-32C (Castagnoli), as TensorBoard's event files checksum their records,
// and the "masked" form they store (so that a CRC of data holding CRCs is
// not degenerate).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace troupe::monitoring {

uint32_t crc32c(const void* data, std::size_t n);
inline uint32_t crc32c(std::string_view s) {
  return crc32c(s.data(), s.size());
}
// TensorFlow's mask: rotate right by 15 bits, add a constant.
uint32_t masked_crc32c(const void* data, std::size_t n);

}  // namespace troupe::monitoring
