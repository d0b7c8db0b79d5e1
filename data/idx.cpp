#include "data/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>

namespace troupe::data {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw data_error(path + ": " + problem);
}

std::string hex_bytes(const uint8_t* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string r;
  for (std::size_t i = 0; i < n; ++i) {
    if (i) r += ' ';
    r += digits[p[i] >> 4];
    r += digits[p[i] & 15];
  }
  return r;
}

const char* idx_type_name(uint8_t t) {
  switch (t) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "unknown";
  }
}

// A byte stream over a plain or gzip-compressed file.
class source {
 public:
  explicit source(const std::string& path) : path_(path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail(path, "cannot open: is a directory");
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) fail(path, std::string("cannot open: ") + std::generic_category().message(errno));
    uint8_t magic[2] = {0, 0};
    std::size_t n = std::fread(magic, 1, 2, file_);
    if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      std::fclose(file_);
      file_ = nullptr;
      gz_ = gzopen(path.c_str(), "rb");
      if (!gz_) fail(path, std::string("cannot open: ") + std::generic_category().message(errno));
      gzbuffer(gz_, 1 << 20);
    } else {
      std::rewind(file_);
    }
  }
  ~source() {
    if (file_) std::fclose(file_);
    if (gz_) gzclose(gz_);
  }
  source(const source&) = delete;
  source& operator=(const source&) = delete;

  bool gzip() const noexcept { return gz_ != nullptr; }

  // The file's size on disk (compressed, for gzip).
  uint64_t file_size() const {
    std::error_code ec;
    uint64_t n = std::filesystem::file_size(path_, ec);
    if (ec) fail(path_, "cannot read its size: " + ec.message());
    return n;
  }
  // gzip: the ISIZE trailer (decompressed size mod 2^32 of the last member).
  std::optional<uint32_t> gzip_trailer_size() const {
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    if (!f) return std::nullopt;
    uint8_t b[4];
    bool ok = std::fseek(f, -4, SEEK_END) == 0 && std::fread(b, 1, 4, f) == 4;
    std::fclose(f);
    if (!ok) return std::nullopt;
    return uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
  }

  // Reads up to n bytes into dst; fewer only at the end of the data.
  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      if (gz_) {
        unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
        int r = gzread(gz_, out + got, chunk);
        check_gz();
        if (r <= 0) break;
        got += static_cast<std::size_t>(r);
      } else {
        std::size_t r = std::fread(out + got, 1, n - got, file_);
        if (std::ferror(file_))
          fail(path_, std::string("read error: ") + std::generic_category().message(errno));
        if (r == 0) break;
        got += r;
      }
    }
    return got;
  }

 private:
  void check_gz() {
    int err = Z_OK;
    const char* msg = gzerror(gz_, &err);
    if (err == Z_OK) return;
    if (err == Z_BUF_ERROR)
      fail(path_, "truncated gzip stream (unexpected end of compressed data)");
    if (err == Z_ERRNO)
      fail(path_, std::string("read error: ") + std::generic_category().message(errno));
    fail(path_, std::string("corrupt gzip data: ") + (msg ? msg : "unknown zlib error"));
  }

  std::string path_;
  std::FILE* file_ = nullptr;
  gzFile gz_ = nullptr;
};

constexpr uint64_t kMaxElements = uint64_t{1} << 40;
// Deflate expands at most 1032:1, so a gzip file of n bytes holds at most
// this many bytes of data.
constexpr uint64_t kMaxDeflateRatio = 1032;

}  // namespace

namespace {

struct header {
  std::vector<int64_t> dims;
  uint64_t total = 1;
  uint64_t header_bytes = 0;
  std::string data_kind;  // "file has " / "decompressed data has "
};

std::string declared(const header& h) {
  std::string dims;
  for (std::size_t i = 0; i < h.dims.size(); ++i)
    dims += (i ? " x " : "") + std::to_string(h.dims[i]);
  return "the header declares " + dims + " = " + std::to_string(h.total) + " bytes of data";
}

// The dimensions against what the file can hold, before anything is
// allocated for them: one flipped bit in a dimension must not cost gigabytes.
// Plain: the exact size. gzip: at most kMaxDeflateRatio times the compressed
// size (the exact size is only known once inflated; read_idx grows its
// buffer as data arrives).
void check_size(const source& src, const std::string& path, const header& h) {
  const uint64_t size = src.file_size();
  if (!src.gzip()) {
    const uint64_t data = size - std::min(size, h.header_bytes);
    if (data < h.total)
      fail(path, "truncated: " + declared(h) + ", expected " + std::to_string(h.total) +
                     " bytes of data, file has " + std::to_string(data) + " (" +
                     std::to_string(size) + " bytes in all)");
    return;
  }
  if (size <= (std::numeric_limits<uint64_t>::max() - h.header_bytes) / kMaxDeflateRatio &&
      h.total > size * kMaxDeflateRatio)
    fail(path, "corrupt header: " + declared(h) + ", more than a gzip file of " +
                   std::to_string(size) + " bytes can hold (at most " +
                   std::to_string(size * kMaxDeflateRatio) + ")");
}

header read_header(source& src, const std::string& path) {
  header h;
  h.data_kind = src.gzip() ? "decompressed data has " : "file has ";
  uint8_t magic[4] = {0, 0, 0, 0};
  std::size_t got = src.read(magic, 4);
  if (got < 4)
    fail(path, "truncated: expected a 4-byte IDX header, " + h.data_kind + std::to_string(got) +
                   " bytes");
  if (magic[0] != 0 || magic[1] != 0 || magic[3] == 0)
    fail(path, "not an IDX file: found magic bytes " + hex_bytes(magic, 4) +
                   ", expected 00 00 08 0N (unsigned-byte IDX with N dimensions)");
  if (magic[2] != 0x08)
    fail(path, "unsupported IDX element type 0x" + hex_bytes(magic + 2, 1) + " (" +
                   idx_type_name(magic[2]) + "); only unsigned byte (0x08) is supported");

  const std::size_t rank = magic[3];
  std::vector<uint8_t> raw(4 * rank);
  got = src.read(raw.data(), raw.size());
  if (got < raw.size())
    fail(path, "truncated: the header declares " + std::to_string(rank) + " dimensions (" +
                   std::to_string(raw.size()) + " bytes), " + h.data_kind + std::to_string(got) +
                   " of them");
  h.dims.resize(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const uint8_t* p = raw.data() + 4 * i;
    uint64_t d = (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) | p[3];
    h.dims[i] = static_cast<int64_t>(d);
    if (d != 0 && h.total > kMaxElements / d)
      fail(path, "implausible IDX dimensions (more than 2^40 elements)");
    h.total *= d;
  }
  h.header_bytes = 4 + 4 * rank;
  check_size(src, path, h);
  return h;
}

}  // namespace

std::vector<int64_t> read_idx_dims(const std::string& path) {
  source src(path);
  header h = read_header(src, path);
  if (src.gzip()) {
    // Callers allocate from these dims: check them against the data's size.
    // The gzip trailer has it (mod 2^32) for a single-member file; when it
    // disagrees, count the inflated bytes (without keeping them).
    const uint64_t want = h.header_bytes + h.total;
    auto isize = src.gzip_trailer_size();
    if (!isize || *isize != static_cast<uint32_t>(want)) {
      uint64_t have = 0;
      std::vector<uint8_t> scratch(1 << 16);
      for (std::size_t n = scratch.size(); n == scratch.size() && have <= h.total;) {
        n = src.read(scratch.data(), scratch.size());
        have += n;
      }
      if (have < h.total)
        fail(path, "truncated: " + declared(h) + ", expected " + std::to_string(h.total) +
                       " bytes of data, decompressed data has " + std::to_string(have));
    }
  }
  return h.dims;
}

idx_array read_idx(const std::string& path) {
  source src(path);
  header h = read_header(src, path);
  const uint64_t total = h.total;
  const std::string& data_kind = h.data_kind;
  idx_array r;
  r.dims = std::move(h.dims);

  // Grow the buffer as data arrives, so a corrupt header can't force a huge
  // allocation up front.
  std::size_t have = 0;
  r.bytes.resize(static_cast<std::size_t>(std::min<uint64_t>(total, uint64_t{64} << 20)));
  while (have < total) {
    if (have == r.bytes.size())
      r.bytes.resize(static_cast<std::size_t>(std::min<uint64_t>(total, 2 * uint64_t{have})));
    std::size_t want = r.bytes.size() - have;
    std::size_t n = src.read(r.bytes.data() + have, want);
    have += n;
    if (n < want) break;
  }
  if (have < total)
    fail(path, "truncated: expected " + std::to_string(total) + " bytes of data, " + data_kind +
                   std::to_string(have));

  uint8_t scratch[1 << 16];
  std::size_t extra = src.read(scratch, sizeof scratch);
  if (extra > 0) {
    for (std::size_t n = extra; n == sizeof scratch;) {
      n = src.read(scratch, sizeof scratch);
      extra += n;
    }
    fail(path, "trailing garbage: " + std::to_string(extra) + " bytes after the " +
                   std::to_string(total) + " data bytes the header declares");
  }
  return r;
}

void write_idx(const std::string& path, const std::vector<int64_t>& dims,
               const std::vector<uint8_t>& bytes, bool gzip) {
  if (dims.empty() || dims.size() > 255)
    fail(path, "cannot write IDX with " + std::to_string(dims.size()) + " dimensions (1..255)");
  std::vector<uint8_t> header = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  uint64_t total = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > int64_t{UINT32_MAX}) fail(path, "invalid IDX dimension " + std::to_string(d));
    auto u = static_cast<uint32_t>(d);
    header.insert(header.end(), {static_cast<uint8_t>(u >> 24), static_cast<uint8_t>(u >> 16),
                                 static_cast<uint8_t>(u >> 8), static_cast<uint8_t>(u)});
    total *= static_cast<uint64_t>(d);
  }
  if (total != bytes.size())
    fail(path, "dimensions declare " + std::to_string(total) + " elements, got " +
                   std::to_string(bytes.size()) + " bytes");

  if (gzip) {
    gzFile g = gzopen(path.c_str(), "wb");
    if (!g) fail(path, std::string("cannot create: ") + std::generic_category().message(errno));
    bool ok = gzwrite(g, header.data(), static_cast<unsigned>(header.size())) ==
              static_cast<int>(header.size());
    for (std::size_t off = 0; ok && off < bytes.size();) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(bytes.size() - off, 1u << 30));
      ok = gzwrite(g, bytes.data() + off, chunk) == static_cast<int>(chunk);
      off += chunk;
    }
    if (gzclose(g) != Z_OK || !ok) fail(path, "write error");
  } else {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail(path, std::string("cannot create: ") + std::generic_category().message(errno));
    bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
              std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (std::fclose(f) != 0 || !ok)
      fail(path, std::string("write error: ") + std::generic_category().message(errno));
  }
}

}  // namespace troupe::data
