#pragma once
// NumPy files: .npy (one array: the magic "\x93NUMPY", a version, a header
// that is a Python dict literal {'descr', 'fortran_order', 'shape'}, then the
// raw elements) and .npz (a zip archive of .npy members, stored or deflated).
// Only little-endian float32/float64/uint8/int32/int64 in C order are read;
// nothing needs pickle. Every size in a file is checked against the file's
// length before anything is allocated for it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/idx.hpp"  // data_error

namespace troupe::data {

enum class npy_dtype : uint8_t { f4, f8, u1, i4, i8 };

// "<f4", "<f8", "|u1", "<i4", "<i8".
const char* npy_descr(npy_dtype t);
std::size_t npy_itemsize(npy_dtype t);
bool npy_is_float(npy_dtype t);

// A file's bytes, memory-mapped private copy-on-write (writes through a
// tensor over them change neither the file nor other mappings). Empty files
// have no mapping. The file must not be truncated while mapped (a read past
// its new end is SIGBUS): data sets are read-only inputs.
struct mapped_file {
  uint8_t* data = nullptr;
  std::size_t size = 0;
  mapped_file() = default;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();
};
// Throws data_error naming the path when it cannot be opened or mapped.
std::shared_ptr<mapped_file> map_file(const std::string& path);

// One array, its elements at `data` (little-endian, C order), kept valid by
// `owner` (a mapping or a buffer).
struct npy_array {
  std::vector<int64_t> dims;
  npy_dtype type = npy_dtype::f4;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::shared_ptr<void> owner;
  int64_t numel() const;
};

// Parses the .npy bytes [p, p + n) that `owner` keeps alive; `name` names
// them in errors ("x_train.npy", "train.npz: member x.npy"). Throws
// data_error for a bad magic or version, a header that is not a dict
// literal of exactly 'descr', 'fortran_order' and 'shape', Fortran order,
// big-endian or object (pickled) or other dtypes, and data shorter or longer
// than the shape says.
npy_array parse_npy(const uint8_t* p, std::size_t n, std::shared_ptr<void> owner,
                    const std::string& name);

// A .npy file, memory-mapped: for float32 data at a 64-byte aligned offset
// (numpy pads its headers so), `data` can back a tensor without a copy.
npy_array read_npy(const std::string& path);

// The arrays `keys` of an .npz file (member "<key>.npy" each). Throws
// data_error for a missing member, a bad or ZIP64 or encrypted archive, a
// compression other than stored or deflate, a CRC or size mismatch, and
// for every problem of parse_npy. A deflated member is bounded before its
// data is inflated: its .npy header is inflated first, and the size its
// shape gives must be the size the archive declares; a member over 16 MiB
// that declares more than 100 times its compressed size is refused (a
// decompression bomb; numpy.savez stores uncompressed, which is read in
// place). The buffer is allocated once; running out of memory is a
// data_error naming the file and the member.
std::vector<npy_array> read_npz(const std::string& path, const std::vector<std::string>& keys);

// The bytes of a .npy file (format version 1, or 2 or 3 when asked) of the
// given array; for tests and tools. Throws data_error when `bytes` does not
// match the dims.
std::string npy_bytes(npy_dtype t, const std::vector<int64_t>& dims, const void* bytes,
                      std::size_t nbytes, int version = 1);
// A zip archive of the members (name, bytes), stored or deflated.
std::string zip_bytes(const std::vector<std::pair<std::string, std::string>>& members,
                      bool deflate);
// Writes bytes to a file; throws data_error naming it on failure.
void write_file(const std::string& path, const std::string& bytes);

}  // namespace troupe::data
