#pragma once
// IDX files (the MNIST / Fashion-MNIST container): a 4-byte magic
// 00 00 <type> <rank>, `rank` big-endian uint32 dimensions, then the raw
// elements. Only unsigned-byte data (type 0x08) is supported. Files may be
// gzip-compressed (detected by the 1f 8b magic) or plain.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::data {

// Any problem reading a data set; what() names the file and the problem.
class data_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct idx_array {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

// Reads a gzip or plain IDX file. Throws data_error when the file cannot be
// opened, is not an IDX file, holds another element type, is truncated, has
// trailing data, or is a corrupt gzip stream.
idx_array read_idx(const std::string& path);

// Reads only the header of an IDX file and returns its dimensions (same
// checks on the magic and element type as read_idx).
std::vector<int64_t> read_idx_dims(const std::string& path);

// Writes an unsigned-byte IDX file (gzip-compressed when `gzip`); for tests and
// tools. Throws data_error when bytes.size() doesn't match the dims.
void write_idx(const std::string& path, const std::vector<int64_t>& dims,
               const std::vector<uint8_t>& bytes, bool gzip);

}  // namespace troupe::data
