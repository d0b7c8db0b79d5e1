// The .npy and .npz writers (data/npy.hpp): numpy's format, for the tests,
// the converters and what troupe writes itself.
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "data/npy.hpp"
#include "data/npy_format.hpp"

namespace troupe::data {

using namespace npy_detail;

std::string npy_bytes(npy_dtype t, const std::vector<int64_t>& dims, const void* bytes,
                      std::size_t nbytes, int version) {
  uint64_t numel = 1;
  for (int64_t d : dims) {
    if (d < 0) throw data_error("npy_bytes: negative dimension");
    numel *= static_cast<uint64_t>(d);
  }
  if (numel * npy_itemsize(t) != nbytes)
    throw data_error("npy_bytes: shape " + dims_string(dims) + " of '" + npy_descr(t) + "' is " +
                     std::to_string(numel * npy_itemsize(t)) + " bytes, got " +
                     std::to_string(nbytes));
  if (version < 1 || version > 3) throw data_error("npy_bytes: version must be 1, 2 or 3");
  std::string dict = std::string("{'descr': '") + npy_descr(t) +
                     "', 'fortran_order': False, 'shape': " + dims_string(dims) + ", }";
  const std::size_t pre = version == 1 ? 10 : 12;
  // numpy pads the header with spaces so that the data starts 64-byte aligned.
  std::size_t total = pre + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - pre - dict.size() - 1, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const std::size_t len = dict.size();
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  if (version > 1) {
    out += static_cast<char>((len >> 16) & 0xff);
    out += static_cast<char>((len >> 24) & 0xff);
  }
  out += dict;
  out.append(static_cast<const char*>(bytes), nbytes);
  return out;
}

namespace {
void put16(std::string& s, uint32_t v) {
  s += static_cast<char>(v & 0xff);
  s += static_cast<char>((v >> 8) & 0xff);
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xffff);
  put16(s, v >> 16);
}
}  // namespace

std::string zip_bytes(const std::vector<std::pair<std::string, std::string>>& members,
                      bool deflate) {
  std::string out, cd;
  for (const auto& [name, data] : members) {
    std::string body = data;
    if (deflate) {
      z_stream zs{};
      if (deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        throw data_error("zip_bytes: cannot start deflate");
      body.assign(deflateBound(&zs, static_cast<uLong>(data.size())), '\0');
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
      zs.avail_in = static_cast<uInt>(data.size());
      zs.next_out = reinterpret_cast<Bytef*>(body.data());
      zs.avail_out = static_cast<uInt>(body.size());
      const int rc = ::deflate(&zs, Z_FINISH);
      body.resize(zs.total_out);
      deflateEnd(&zs);
      if (rc != Z_STREAM_END) throw data_error("zip_bytes: deflate failed");
    }
    const uint32_t crc = crc_of(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    const auto offset = static_cast<uint32_t>(out.size());
    const uint16_t method = deflate ? 8 : 0;
    put32(out, kLocalSig);
    put16(out, 20);
    put16(out, 0);
    put16(out, method);
    put32(out, 0);  // time, date
    put32(out, crc);
    put32(out, static_cast<uint32_t>(body.size()));
    put32(out, static_cast<uint32_t>(data.size()));
    put16(out, static_cast<uint32_t>(name.size()));
    put16(out, 0);
    out += name;
    out += body;
    put32(cd, kCentralSig);
    put16(cd, 20);
    put16(cd, 20);
    put16(cd, 0);
    put16(cd, method);
    put32(cd, 0);
    put32(cd, crc);
    put32(cd, static_cast<uint32_t>(body.size()));
    put32(cd, static_cast<uint32_t>(data.size()));
    put16(cd, static_cast<uint32_t>(name.size()));
    put16(cd, 0);
    put16(cd, 0);
    put16(cd, 0);
    put16(cd, 0);
    put32(cd, 0);
    put32(cd, offset);
    cd += name;
  }
  const auto cd_off = static_cast<uint32_t>(out.size());
  out += cd;
  put32(out, kEndSig);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint32_t>(members.size()));
  put16(out, static_cast<uint32_t>(members.size()));
  put32(out, static_cast<uint32_t>(cd.size()));
  put32(out, cd_off);
  put16(out, 0);
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail(path, std::string("cannot create: ") + std::generic_category().message(errno));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok)
    fail(path, std::string("write error: ") + std::generic_category().message(errno));
}

}  // namespace troupe::data
