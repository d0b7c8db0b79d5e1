#include "data/npy.hpp"

#include "data/npy_format.hpp"

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

namespace npy_detail {

[[noreturn]] void fail(const std::string& name, const std::string& problem) {
  throw data_error(name + ": " + problem);
}

uint16_t le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

std::string printable(std::string_view s, std::size_t most) {
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

std::string dims_string(const std::vector<int64_t>& dims) {
  // As Python writes a tuple: (), (3,), (2, 3).
  std::string r = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) r += (i ? ", " : "") + std::to_string(dims[i]);
  return r + (dims.size() == 1 ? ",)" : ")");
}

}  // namespace npy_detail

using namespace npy_detail;

namespace {

// More elements than this in one array is a corrupt header, whatever the
// file's length (it bounds the products below away from overflow).
constexpr uint64_t kMaxElements = uint64_t{1} << 40;
// numpy writes headers of a few hundred bytes; a megabyte is corruption.
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;

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

}  // namespace

namespace npy_detail {

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

std::string npy_layout::declared() const {
  return "shape " + dims_string(dims) + " of '" + npy_descr(type) + "' is " +
         std::to_string(nbytes) + " bytes of data";
}

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

}  // namespace npy_detail

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

}  // namespace troupe::data
