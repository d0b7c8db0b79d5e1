#include "data/npy.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <system_error>
#include <unordered_set>

namespace troupe::data {

// Elements are used in place (mapped, copied byte for byte), so the host's
// byte order must be the files'.
static_assert(std::endian::native == std::endian::little, "the .npy readers assume little-endian");

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& problem) {
  throw data_error(name + ": " + problem);
}

// More elements than this in one array is a corrupt header, whatever the
// file's length (it bounds the products below away from overflow).
constexpr uint64_t kMaxElements = uint64_t{1} << 40;
// numpy writes headers of a few hundred bytes; a megabyte is corruption.
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;

uint16_t le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

std::string printable(std::string_view s, std::size_t most = 40) {
  std::string r;
  for (char c : s.substr(0, most)) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      r += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      r += buf;
    }
  }
  if (s.size() > most) r += "...";
  return r;
}

// The header dict, as a small recursive-descent reader of the Python literal
// subset numpy writes: strings without escapes, True/False, tuples of
// non-negative integers. Anything else (a list descr of a structured dtype,
// a call, an expression) is refused, never evaluated.
class header_parser {
 public:
  header_parser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  struct value {
    enum kind_t { string, boolean, tuple } kind = string;
    std::string str;
    bool b = false;
    std::vector<int64_t> ints;
  };

  std::map<std::string, value> dict() {
    std::map<std::string, value> out;
    skip();
    expect('{');
    skip();
    while (peek() != '}') {
      std::string key = string_literal("a string key");
      if (out.count(key)) bad("duplicate key '" + key + "'");
      skip();
      expect(':');
      skip();
      out[key] = parse_value(key);
      skip();
      if (peek() == ',') {
        ++i_;
        skip();
      } else if (peek() != '}') {
        bad("expected ',' or '}' after the value of '" + key + "'");
      }
    }
    ++i_;
    skip();
    if (i_ != s_.size()) bad("unexpected text after the dict: '" + printable(s_.substr(i_)) + "'");
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(name_, "header is not a valid Python dict literal (" + what + " at character " +
                    std::to_string(i_) + "): '" + printable(s_, 120) + "'");
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_literal(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') bad(std::string("expected ") + what);
    ++i_;
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' || s_[i_] == '\n') bad("escapes and line breaks in strings are not read");
      ++i_;
    }
    if (i_ >= s_.size()) bad("unterminated string");
    std::string r(s_.substr(start, i_ - start));
    ++i_;
    return r;
  }
  value parse_value(const std::string& key) {
    value v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = value::string;
      v.str = string_literal("a string");
    } else if (s_.substr(i_).starts_with("True")) {
      v.kind = value::boolean;
      v.b = true;
      i_ += 4;
    } else if (s_.substr(i_).starts_with("False")) {
      v.kind = value::boolean;
      i_ += 5;
    } else if (c == '(') {
      v.kind = value::tuple;
      ++i_;
      skip();
      bool comma = false;
      while (peek() != ')') {
        v.ints.push_back(integer());
        skip();
        comma = peek() == ',';
        if (comma) {
          ++i_;
          skip();
        } else if (peek() != ')') {
          bad("expected ',' or ')' in the tuple of '" + key + "'");
        }
      }
      // (3) is the integer 3 in Python, not a tuple.
      if (v.ints.size() == 1 && !comma) bad("'(n)' is not a tuple; a 1-tuple is '(n,)'");
      ++i_;
    } else if (c == '[') {
      if (key == "descr") fail(name_, "structured dtypes (a list descr) are not supported");
      bad("lists are not read");
    } else {
      bad("expected a string, True, False or a tuple for '" + key + "'");
    }
    return v;
  }
  int64_t integer() {
    const std::size_t start = i_;
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      if (v > kMaxElements) fail(name_, "implausible dimension in the shape (more than 2^40)");
      ++i_;
    }
    if (i_ == start) bad("expected a non-negative integer");
    if (i_ - start > 1 && s_[start] == '0') bad("leading zeros");
    return static_cast<int64_t>(v);
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t i_ = 0;
};

std::string dims_string(const std::vector<int64_t>& dims) {
  // As Python writes a tuple: (), (3,), (2, 3).
  std::string r = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) r += (i ? ", " : "") + std::to_string(dims[i]);
  return r + (dims.size() == 1 ? ",)" : ")");
}

npy_dtype parse_descr(const std::string& d, const std::string& name) {
  if (d == "<f4") return npy_dtype::f4;
  if (d == "<f8") return npy_dtype::f8;
  if (d == "|u1" || d == "<u1") return npy_dtype::u1;
  if (d == "<i4") return npy_dtype::i4;
  if (d == "<i8") return npy_dtype::i8;
  const std::string supported = " (supported: '<f4', '<f8', '|u1', '<i4', '<i8')";
  if (d.size() > 1 && d[1] == 'O')
    fail(name, "object arrays ('" + printable(d) + "') need pickle and are refused" + supported);
  if (!d.empty() && d[0] == '>' && d.size() > 2 && d.substr(2) != "1")
    fail(name,
         "big-endian dtype '" + printable(d) +
             "' is not supported; save it little-endian (arr.astype(arr.dtype.newbyteorder('<')))" +
             supported);
  fail(name, "unsupported dtype '" + printable(d) + "'" + supported);
}

}  // namespace

const char* npy_descr(npy_dtype t) {
  switch (t) {
    case npy_dtype::f4:
      return "<f4";
    case npy_dtype::f8:
      return "<f8";
    case npy_dtype::u1:
      return "|u1";
    case npy_dtype::i4:
      return "<i4";
    case npy_dtype::i8:
      return "<i8";
  }
  return "?";
}

std::size_t npy_itemsize(npy_dtype t) {
  switch (t) {
    case npy_dtype::f4:
    case npy_dtype::i4:
      return 4;
    case npy_dtype::f8:
    case npy_dtype::i8:
      return 8;
    case npy_dtype::u1:
      return 1;
  }
  return 1;
}

bool npy_is_float(npy_dtype t) {
  return t == npy_dtype::f4 || t == npy_dtype::f8;
}

int64_t npy_array::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

mapped_file::~mapped_file() {
  if (data) ::munmap(data, size);
}

std::shared_ptr<mapped_file> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::generic_category().message(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, std::string("cannot read its size: ") + std::generic_category().message(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail(path, "cannot open: is a directory");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "cannot open: not a regular file");
  }
  auto m = std::make_shared<mapped_file>();
  if (st.st_size > 0) {
    // Writable private pages: a tensor over them is as writable as any
    // other, and a write copies the page instead of faulting.
    void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, std::string("cannot map: ") + std::generic_category().message(err));
    }
    m->data = static_cast<uint8_t*>(p);
    m->size = static_cast<std::size_t>(st.st_size);
  }
  ::close(fd);
  return m;
}

namespace {

// Where a .npy header's dict lies: [start, start + length).
struct npy_preamble {
  uint64_t start = 0, length = 0;
  uint64_t end() const { return start + length; }
};

// The magic, the version and the header's length, from the first `n`
// bytes (the header itself need not be among them).
npy_preamble read_preamble(const uint8_t* p, std::size_t n, const std::string& name) {
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (n < 10) fail(name, "truncated: " + std::to_string(n) + " bytes, shorter than a .npy header");
  if (std::memcmp(p, magic, 6) != 0)
    fail(name, "not a .npy file: the first bytes are '" +
                   printable(std::string_view(reinterpret_cast<const char*>(p), 6)) +
                   "', expected '\\x93NUMPY'");
  const int major = p[6];
  if (major < 1 || major > 3)
    fail(name, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(p[7]) + " (supported: 1, 2, 3)");
  npy_preamble pre;
  if (major == 1) {
    pre.length = le16(p + 8);
    pre.start = 10;
  } else {
    if (n < 12)
      fail(name, "truncated: " + std::to_string(n) + " bytes, shorter than a version " +
                     std::to_string(major) + " .npy header");
    pre.length = le32(p + 8);
    pre.start = 12;
  }
  if (pre.length > kMaxHeaderBytes)
    fail(name, "corrupt header: it declares " + std::to_string(pre.length) +
                   " header bytes (more than 1 MiB)");
  return pre;
}

// The header dict's three keys, each of its kind.
std::map<std::string, header_parser::value> header_dict(std::string_view text,
                                                        const std::string& name) {
  if (text.empty() || text.back() != '\n')
    fail(name, "corrupt header: it does not end with a newline");
  auto dict = header_parser(text.substr(0, text.size() - 1), name).dict();
  for (const auto& [key, v] : dict)
    if (key != "descr" && key != "fortran_order" && key != "shape")
      fail(name, "header has an unknown key '" + printable(key) +
                     "' (expected exactly 'descr', 'fortran_order', 'shape')");
  for (const char* key : {"descr", "fortran_order", "shape"})
    if (!dict.count(key))
      fail(name, std::string("header lacks the key '") + key +
                     "' (expected exactly 'descr', 'fortran_order', 'shape')");
  if (dict["descr"].kind != header_parser::value::string)
    fail(name, "header: 'descr' is not a string");
  if (dict["fortran_order"].kind != header_parser::value::boolean)
    fail(name, "header: 'fortran_order' is not True or False");
  if (dict["shape"].kind != header_parser::value::tuple)
    fail(name, "header: 'shape' is not a tuple");
  return dict;
}

// What a .npy header declares: its dtype, its shape, where its data starts
// and how many bytes the data is.
struct npy_layout {
  npy_dtype type = npy_dtype::f4;
  std::vector<int64_t> dims;
  uint64_t offset = 0, nbytes = 0;
  std::string declared() const {
    return "shape " + dims_string(dims) + " of '" + npy_descr(type) + "' is " +
           std::to_string(nbytes) + " bytes of data";
  }
};

// The header alone: [p, p + n) holds at least the preamble and the dict.
npy_layout parse_header(const uint8_t* p, std::size_t n, const std::string& name) {
  const auto pre = read_preamble(p, n, name);
  if (pre.length > n - pre.start)
    fail(name, "truncated: the header declares " + std::to_string(pre.length) +
                   " bytes, the file has " + std::to_string(n - pre.start) + " after the preamble");
  auto dict =
      header_dict(std::string_view(reinterpret_cast<const char*>(p + pre.start), pre.length), name);
  npy_layout l;
  l.type = parse_descr(dict["descr"].str, name);
  if (dict["fortran_order"].b)
    fail(name,
         "Fortran-order arrays (fortran_order: True) are not supported; save a C-order "
         "array (numpy.ascontiguousarray)");
  l.dims = dict["shape"].ints;
  uint64_t numel = 1;
  for (int64_t d : l.dims) {
    const auto u = static_cast<uint64_t>(d);
    if (u != 0 && numel > kMaxElements / u)
      fail(name, "implausible shape " + dims_string(l.dims) + " (more than 2^40 elements)");
    numel *= u;
  }
  l.offset = pre.end();
  l.nbytes = numel * npy_itemsize(l.type);
  return l;
}

}  // namespace

npy_array parse_npy(const uint8_t* p, std::size_t n, std::shared_ptr<void> owner,
                    const std::string& name) {
  const auto l = parse_header(p, n, name);
  const uint64_t have = n - l.offset;
  if (have < l.nbytes)
    fail(name, "truncated: " + l.declared() + ", the file has " + std::to_string(have));
  if (have > l.nbytes)
    fail(name, "trailing bytes: " + l.declared() + ", the file has " + std::to_string(have) + " (" +
                   std::to_string(have - l.nbytes) + " more)");
  npy_array a;
  a.type = l.type;
  a.dims = l.dims;
  a.data = p + l.offset;
  a.nbytes = l.nbytes;
  a.owner = std::move(owner);
  return a;
}

npy_array read_npy(const std::string& path) {
  auto m = map_file(path);
  const uint8_t* p = m->data;
  const std::size_t n = m->size;
  static const uint8_t none = 0;
  return parse_npy(p ? p : &none, n, std::move(m), path);
}

// ---------------------------------------------------------------- npz (zip)

namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
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
  head.resize(static_cast<std::size_t>(pre.end()));
  have += in.fill(head.data() + have, head.size() - have);
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

uint32_t crc_of(const uint8_t* p, uint64_t n) {
  uLong crc = crc32(0, nullptr, 0);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
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

// ---------------------------------------------------------------- writers

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
