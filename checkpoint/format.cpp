// The checkpoint format's shared helpers: checksums, POSIX file I/O,
// checkpoint directory names.
#include "checkpoint/format.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace troupe::checkpoint::detail {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t crc_of(const void* data, uint64_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    auto chunk = static_cast<uInt>(std::min<uint64_t>(n, uint64_t{1} << 30));
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

[[noreturn]] void sys_fail(const std::string& what) {
  throw checkpoint_error(what + ": " + std::strerror(errno));
}

void write_all(int fd, const void* data, uint64_t n, const std::string& file) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, static_cast<std::size_t>(std::min<uint64_t>(n, 1u << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      sys_fail("cannot write " + file);
    }
    p += w;
    n -= static_cast<uint64_t>(w);
  }
}

void close_synced(fd_guard& fd, const std::string& file) {
  if (::fsync(fd.get()) != 0) sys_fail("cannot fsync " + file);
  if (::close(fd.release()) != 0) sys_fail("cannot close " + file);
}

void fsync_dir(const fs::path& dir) {
  fd_guard fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) sys_fail("cannot open directory " + dir.string());
  if (::fsync(fd.get()) != 0) sys_fail("cannot fsync directory " + dir.string());
}

void read_at(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& what) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, static_cast<std::size_t>(std::min<uint64_t>(n, 1u << 30)),
                        static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(what);
    }
    if (r == 0) throw checkpoint_error(what + ": unexpected end of file");
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

std::optional<int64_t> parse_step(const std::string& name) {
  static const std::string prefix = "ckpt-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return {};
  std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return {};
  return std::stoll(digits);
}

std::vector<found> list_checkpoints(const fs::path& root) {
  std::vector<found> r;
  std::error_code ec;
  fs::directory_iterator it(root, ec), end;
  if (ec) return r;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    auto step = parse_step(it->path().filename().string());
    std::error_code ec2;
    if (step && it->is_directory(ec2)) r.push_back({*step, it->path()});
  }
  std::sort(r.begin(), r.end(), [](const found& a, const found& b) { return a.step > b.step; });
  return r;
}

std::string label(const std::string& dir) {
  return "checkpoint " + dir;
}

}  // namespace troupe::checkpoint::detail
