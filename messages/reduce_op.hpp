#pragma once
// The one reduction enum: what a collective computes, whether the reducer
// actors run it (messages/protocols.hpp), a device communicator
// (collectives/process_group.hpp) or a custom loop (<troupe/troupe.hpp>).
// Part of the public API, so it needs no CAF.
#include <cstdint>
#include <string>

namespace troupe {

// mean = sum / group size.
enum class reduce_op : uint8_t { sum = 0, mean = 1, min = 2, max = 3 };
const char* reduce_op_name(reduce_op op);
// Parses "sum", "mean", "min", "max"; throws std::invalid_argument otherwise.
reduce_op parse_reduce_op(const std::string& s);
inline std::string to_string(reduce_op op) {
  return reduce_op_name(op);
}

}  // namespace troupe
