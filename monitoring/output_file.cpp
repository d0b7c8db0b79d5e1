#include "monitoring/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace troupe::monitoring {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw output_file_error(path + ": " + why);
}

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// Why `fd` (just opened at `path`) must not be written, or "".
std::string unsafe_target(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file; refusing to write to it";
  if (st.st_nlink > 1)
    return "has " + std::to_string(st.st_nlink) +
           " hard links; refusing to write through a link to another file";
  return "";
}

int open_flags(output_file::mode m) {
  const int common = O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_CREAT;
  switch (m) {
    case output_file::mode::create_new:
      return common | O_EXCL;
    case output_file::mode::append:
      return common | O_APPEND;
    case output_file::mode::replace:
      return common;  // truncated after the checks, never before
  }
  return common | O_EXCL;
}

}  // namespace

output_file::output_file(std::string path, mode m) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), open_flags(m), 0644);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ELOOP || (err == EEXIST && is_symlink(path_)))
      fail(path_, "is a symbolic link; refusing to write through it");
    fail(path_, std::string("cannot create: ") + std::strerror(err));
  }
  const std::string why = unsafe_target(fd_);
  if (why.empty() && m == mode::replace && ::ftruncate(fd_, 0) != 0) good_ = false;
  if (!why.empty()) {
    ::close(fd_);
    fd_ = -1;
    fail(path_, why);
  }
}

output_file::~output_file() {
  if (fd_ >= 0) ::close(fd_);
}

output_file::output_file(output_file&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), good_(other.good_) {}

output_file& output_file::operator=(output_file&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    good_ = other.good_;
  }
  return *this;
}

bool output_file::write(std::string_view bytes) {
  while (good() && !bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) good_ = false;
    if (n > 0) bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return good();
}

void write_output_file(const std::string& path, std::string_view bytes) {
  output_file f(path, output_file::mode::replace);
  if (!f.write(bytes)) fail(path, std::string("cannot write: ") + std::strerror(errno));
}

void replace_file_atomically(const std::string& path, const std::string& temporary,
                             std::string_view bytes) {
  ::unlink(temporary.c_str());
  try {
    output_file f(temporary, output_file::mode::create_new);
    if (!f.write(bytes)) fail(temporary, std::string("cannot write: ") + std::strerror(errno));
  } catch (const output_file_error&) {
    ::unlink(temporary.c_str());
    throw;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    fail(path, std::string("cannot replace it: ") + std::strerror(err));
  }
}

}  // namespace troupe::monitoring
