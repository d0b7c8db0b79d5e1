#pragma once
// What the .npy reader (data/npy.cpp), the .npz reader (data/npz.cpp) and
// the writers (data/npy_write.cpp) share: numpy's header, read, and the
// small helpers of both formats. Not for use outside data/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/npy.hpp"

namespace troupe::data::npy_detail {

// Throws data_error "<name>: <problem>".
[[noreturn]] void fail(const std::string& name, const std::string& problem);

// Little-endian integers at `p`.
uint16_t le16(const uint8_t* p);
uint32_t le32(const uint8_t* p);

// At most `most` characters of `s`, the unprintable ones escaped (\xNN).
std::string printable(std::string_view s, std::size_t most = 40);

// As Python writes a tuple: (), (3,), (2, 3).
std::string dims_string(const std::vector<int64_t>& dims);

// The zip records an .npz holds: a member's local header, the central
// directory's entries, its end.
inline constexpr uint32_t kLocalSig = 0x04034b50;
inline constexpr uint32_t kCentralSig = 0x02014b50;
inline constexpr uint32_t kEndSig = 0x06054b50;

// zlib's CRC-32 of [p, p + n).
uint32_t crc_of(const uint8_t* p, uint64_t n);

// Where a .npy header's dict lies: [start, start + length).
struct npy_preamble {
  uint64_t start = 0, length = 0;
  uint64_t end() const { return start + length; }
};

// The magic, the version and the header's length, from the first `n`
// bytes (the header itself need not be among them).
npy_preamble read_preamble(const uint8_t* p, std::size_t n, const std::string& name);

// What a .npy header declares: its dtype, its shape, where its data starts
// and how many bytes the data is.
struct npy_layout {
  npy_dtype type = npy_dtype::f4;
  std::vector<int64_t> dims;
  uint64_t offset = 0, nbytes = 0;
  std::string declared() const;
};

// The header alone: [p, p + n) holds at least the preamble and the dict.
npy_layout parse_header(const uint8_t* p, std::size_t n, const std::string& name);

}  // namespace troupe::data::npy_detail
