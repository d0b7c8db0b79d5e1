// .npz archives (zip of .npy members, stored or deflated): read_npz
// (data/npy.hpp), reading each member's .npy header as data/npy.cpp does.
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_set>

#include "data/npy.hpp"
#include "data/npy_format.hpp"

namespace troupe::data {

using namespace npy_detail;

uint32_t npy_detail::crc_of(const uint8_t* p, uint64_t n) {
  uLong crc = crc32(0, nullptr, 0);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

namespace {

constexpr uint32_t kZip64LocatorSig = 0x07064b50;
// Deflate expands at most 1032:1.
constexpr uint64_t kMaxDeflateRatio = 1032;
// A member that inflates to more than this many times its compressed size
// is refused (npy.hpp), once it is over kRatioCheckedFrom bytes: a small one
// costs nothing whatever its ratio.
constexpr uint64_t kMaxNpzRatio = 100;
constexpr uint64_t kRatioCheckedFrom = uint64_t{16} << 20;

struct zip_entry {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t csize = 0, usize = 0, local = 0;
};

std::vector<zip_entry> central_directory(const uint8_t* p, std::size_t n, const std::string& path,
                                         uint64_t& cd_start) {
  if (n < 22)
    fail(path, "not a zip (.npz) archive: " + std::to_string(n) +
                   " bytes, shorter than a zip end record");
  // The end record is the last 22 bytes plus a comment of up to 65535; the
  // comment length must reach the end of the file exactly.
  std::size_t end = std::string::npos;
  const std::size_t lowest = n >= 22 + 65535 ? n - 22 - 65535 : 0;
  for (std::size_t i = n - 22 + 1; i-- > lowest;)
    if (le32(p + i) == kEndSig && i + 22 + le16(p + i + 20) == n) {
      end = i;
      break;
    }
  if (end == std::string::npos)
    fail(path, "not a zip (.npz) archive: no end-of-central-directory record");
  const uint8_t* e = p + end;
  const uint16_t disk = le16(e + 4), cd_disk = le16(e + 6);
  const uint16_t here = le16(e + 8), total = le16(e + 10);
  const uint32_t cd_size = le32(e + 12), cd_off = le32(e + 16);
  if ((end >= 20 && le32(p + end - 20) == kZip64LocatorSig) || total == 0xffff ||
      cd_size == 0xffffffff || cd_off == 0xffffffff)
    fail(path, "ZIP64 archives are not supported (numpy writes them for members over 4 GiB)");
  if (disk != 0 || cd_disk != 0 || here != total)
    fail(path, "multi-disk zip archives are not supported");
  if (uint64_t{cd_off} + cd_size > end)
    fail(path, "corrupt zip: the central directory (" + std::to_string(cd_size) + " bytes at " +
                   std::to_string(cd_off) + ") runs past its end record at " + std::to_string(end));
  if (uint64_t{total} * 46 > cd_size)
    fail(path, "corrupt zip: " + std::to_string(total) +
                   " entries cannot fit a central directory of " + std::to_string(cd_size) +
                   " bytes");
  cd_start = cd_off;
  std::vector<zip_entry> out;
  out.reserve(total);
  std::unordered_set<std::string> names;
  std::size_t at = cd_off;
  const std::size_t cd_end = std::size_t{cd_off} + cd_size;
  for (uint16_t k = 0; k < total; ++k) {
    if (cd_end - at < 46 || le32(p + at) != kCentralSig)
      fail(path, "corrupt zip: central directory entry " + std::to_string(k) + " at " +
                     std::to_string(at) + " is cut off or has a bad signature");
    const uint8_t* c = p + at;
    zip_entry z;
    z.flags = le16(c + 8);
    z.method = le16(c + 10);
    z.crc = le32(c + 16);
    z.csize = le32(c + 20);
    z.usize = le32(c + 24);
    const std::size_t name_len = le16(c + 28), extra_len = le16(c + 30), comment_len = le16(c + 32);
    z.local = le32(c + 42);
    if (cd_end - at - 46 < name_len + extra_len + comment_len)
      fail(path, "corrupt zip: central directory entry " + std::to_string(k) +
                     " runs past the directory");
    z.name.assign(reinterpret_cast<const char*>(c + 46), name_len);
    if (z.csize == 0xffffffff || z.usize == 0xffffffff || z.local == 0xffffffff)
      fail(path,
           "member '" + printable(z.name) +
               "': ZIP64 archives are not supported (numpy writes them for members over 4 GiB)");
    // A set, not a scan of the entries so far: 65535 entries would make
    // that billions of comparisons.
    if (!names.insert(z.name).second) fail(path, "duplicate member '" + printable(z.name) + "'");
    out.push_back(std::move(z));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

// A deflated member's stream, inflated piece by piece into the caller's
// buffers: nothing is allocated here by what the stream says.
class member_inflater {
 public:
  member_inflater(const uint8_t* src, uint64_t csize, const std::string& name) : name_(name) {
    if (inflateInit2(&zs_, -15) != Z_OK) fail(name_, "cannot start zlib's inflate");
    zs_.next_in = const_cast<Bytef*>(src);    // zlib's API is not const; it only reads
    zs_.avail_in = static_cast<uInt>(csize);  // csize < 2^32 (no ZIP64)
  }
  ~member_inflater() { inflateEnd(&zs_); }
  member_inflater(const member_inflater&) = delete;
  member_inflater& operator=(const member_inflater&) = delete;

  // Inflates into [out, out + n) until it is full, the stream ends or its
  // input runs out; returns the bytes written.
  std::size_t fill(uint8_t* out, std::size_t n) {
    std::size_t have = 0;
    while (have < n && !ended_) {
      zs_.next_out = out + have;
      zs_.avail_out = static_cast<uInt>(std::min<std::size_t>(n - have, 1u << 30));
      const uInt before = zs_.avail_out, in_before = zs_.avail_in;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      have += before - zs_.avail_out;
      if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT)
        fail(name_,
             "corrupt deflate data" + std::string(zs_.msg ? ": " : "") + (zs_.msg ? zs_.msg : ""));
      if (rc == Z_MEM_ERROR) fail(name_, "out of memory inflating");
      ended_ = rc == Z_STREAM_END;
      if (rc == Z_BUF_ERROR && zs_.avail_out == before && zs_.avail_in == in_before) break;
    }
    return have;
  }
  bool ended() const { return ended_; }

 private:
  z_stream zs_{};
  bool ended_ = false;
  const std::string& name_;
};

// What a member inflates to must be exactly `usize` bytes: a stream that
// ends short, goes on past it or is cut off is refused.
void expect_inflated(member_inflater& in, std::size_t have, uint64_t usize,
                     const std::string& name) {
  if (have < usize && in.ended())
    fail(name, "corrupt zip: the member inflates to " + std::to_string(have) +
                   " bytes, its directory entry says " + std::to_string(usize));
  uint8_t probe = 0;
  if (have == usize && !in.ended() && in.fill(&probe, 1) == 1)
    fail(name, "corrupt zip: the member inflates to more than its declared " +
                   std::to_string(usize) + " bytes");
  if (!in.ended())
    fail(name, "truncated deflate data (" + std::to_string(have) + " of " + std::to_string(usize) +
                   " bytes inflated)");
}

// The member's .npy preamble and header, inflated alone (at most 1 MiB and
// a few bytes), so that its shape bounds what the rest may inflate to. A
// stream that ends within them leaves them short, which parse_header names.
std::vector<uint8_t> inflate_header(member_inflater& in, uint64_t usize, const std::string& name) {
  std::vector<uint8_t> head(static_cast<std::size_t>(std::min<uint64_t>(usize, 12)));
  std::size_t have = in.fill(head.data(), head.size());
  head.resize(have);
  const auto pre = read_preamble(head.data(), have, name);
  // A header declared shorter than the bytes already inflated is corrupt;
  // parse_header names it from these bytes, as it does for a stored member.
  const auto end = static_cast<std::size_t>(pre.end());
  if (end <= have) return head;
  head.resize(end);
  have += in.fill(head.data() + have, end - have);
  head.resize(have);
  return head;
}

// A deflated member's bytes: its header first; the rest only when the shape
// there accounts for exactly the size the directory declares, allocated
// once (a failed allocation names the member, never a bare bad_alloc).
std::vector<uint8_t> inflate_member(const uint8_t* src, uint64_t csize, uint64_t usize,
                                    const std::string& name) {
  member_inflater in(src, csize, name);
  auto head = inflate_header(in, usize, name);
  const auto l = parse_header(head.data(), head.size(), name);
  if (l.offset + l.nbytes != usize)
    fail(name, "corrupt zip: its .npy header's " + l.declared() + " (" +
                   std::to_string(l.offset + l.nbytes) +
                   " bytes with the header), its directory entry says " + std::to_string(usize));
  std::vector<uint8_t> out;
  try {
    out.resize(static_cast<std::size_t>(usize));
  } catch (const std::bad_alloc&) {
    fail(name, "out of memory: cannot hold its " + std::to_string(usize) + " inflated bytes");
  }
  std::memcpy(out.data(), head.data(), head.size());
  const std::size_t have =
      head.size() + in.fill(out.data() + head.size(), out.size() - head.size());
  expect_inflated(in, have, usize, name);
  return out;
}

// Before anything is inflated: the sizes a deflated member declares. Deflate
// itself expands at most 1032:1; beyond kMaxNpzRatio (data sets compress a
// few times, not hundreds) it is refused as a likely decompression bomb.
void check_deflated_sizes(uint64_t csize, uint64_t usize, const std::string& name) {
  if (usize > csize * kMaxDeflateRatio + 64)
    fail(name, "corrupt zip: " + std::to_string(csize) +
                   " compressed bytes cannot inflate to the declared " + std::to_string(usize));
  if (usize > kRatioCheckedFrom && usize > csize * kMaxNpzRatio)
    fail(name, std::to_string(csize) + " compressed bytes declare " + std::to_string(usize) +
                   " inflated, more than " + std::to_string(kMaxNpzRatio) +
                   " times as many (a decompression bomb?); save it uncompressed (numpy.savez) "
                   "to load it as it is");
}

// Where a member's data starts, checked against its local header and the
// archive's bounds.
const uint8_t* member_data(const uint8_t* p, uint64_t cd_start, const zip_entry& z,
                           const std::string& name) {
  if (z.flags & 1) fail(name, "encrypted members are not supported");
  if (z.method != 0 && z.method != 8)
    fail(name, "unsupported compression method " + std::to_string(z.method) +
                   " (supported: 0 stored, 8 deflate)");
  if (z.local > cd_start || cd_start - z.local < 30 || le32(p + z.local) != kLocalSig)
    fail(name, "corrupt zip: no local header at offset " + std::to_string(z.local));
  const uint8_t* l = p + z.local;
  const uint64_t lname = le16(l + 26), lextra = le16(l + 28);
  const uint64_t data_at = z.local + 30 + lname + lextra;
  if (data_at > cd_start || cd_start - data_at < z.csize)
    fail(name, "corrupt zip: its " + std::to_string(z.csize) + " bytes at offset " +
                   std::to_string(data_at) + " run past the central directory at " +
                   std::to_string(cd_start));
  if (lname != z.name.size() || std::memcmp(l + 30, z.name.data(), z.name.size()) != 0)
    fail(name, "corrupt zip: the local header names another member");
  return p + data_at;
}

// One member as an array: a stored one in place (the mapping `m` owns it),
// a deflated one inflated into a buffer of its own.
npy_array read_member(const uint8_t* src, const zip_entry& z, const std::shared_ptr<mapped_file>& m,
                      const std::string& name) {
  if (z.method == 0) {
    if (z.csize != z.usize)
      fail(name, "corrupt zip: a stored member of " + std::to_string(z.csize) + " bytes declares " +
                     std::to_string(z.usize) + " uncompressed");
    if (crc_of(src, z.csize) != z.crc) fail(name, "CRC mismatch: the data is corrupt");
    return parse_npy(src, static_cast<std::size_t>(z.csize), m, name);
  }
  check_deflated_sizes(z.csize, z.usize, name);
  auto buf = std::make_shared<std::vector<uint8_t>>(inflate_member(src, z.csize, z.usize, name));
  if (crc_of(buf->data(), buf->size()) != z.crc) fail(name, "CRC mismatch: the data is corrupt");
  static const uint8_t empty = 0;
  const uint8_t* q = buf->empty() ? &empty : buf->data();
  const std::size_t len = buf->size();
  return parse_npy(q, len, std::move(buf), name);
}

}  // namespace

std::vector<npy_array> read_npz(const std::string& path, const std::vector<std::string>& keys) {
  auto m = map_file(path);
  static const uint8_t none = 0;
  const uint8_t* p = m->data ? m->data : &none;
  uint64_t cd_start = 0;
  const auto entries = central_directory(p, m->size, path, cd_start);
  std::vector<npy_array> out;
  for (const auto& key : keys) {
    const std::string member = key + ".npy";
    auto it = std::find_if(entries.begin(), entries.end(),
                           [&](const zip_entry& z) { return z.name == member; });
    if (it == entries.end()) {
      std::string have;
      for (const auto& z : entries) have += (have.empty() ? "'" : ", '") + printable(z.name) + "'";
      fail(path, "no member '" + member + "' (the array '" + key + "'); the archive holds " +
                     (have.empty() ? "nothing" : have));
    }
    const std::string name = path + ": member " + member;
    out.push_back(read_member(member_data(p, cd_start, *it, name), *it, m, name));
  }
  return out;
}

}  // namespace troupe::data
