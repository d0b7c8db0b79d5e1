#pragma once
// Files a run writes under predictable names (TensorBoard event files, port
// files, summary.json, metrics.jsonl), possibly in a directory others can
// write to: never written through a symbolic link someone planted there, nor
// through a hard link to someone else's file.
//
//   create_new  O_CREAT | O_EXCL | O_NOFOLLOW: the file must not exist; a
//               name taken by a symbolic link is an error naming the path.
//   replace     a file a run legitimately writes again (a port file from an
//               earlier run): O_NOFOLLOW, then fstat: a regular file with one
//               link, truncated only after that check.
//   append      as replace, without the truncation (metrics.jsonl on resume).
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe::monitoring {

class output_file_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class output_file {
 public:
  enum class mode { create_new, replace, append };
  output_file() = default;
  // Throws output_file_error "<path>: <why>" (a symbolic link, a hard link,
  // not a regular file, or the system's reason).
  output_file(std::string path, mode m);
  ~output_file();
  output_file(output_file&& other) noexcept;
  output_file& operator=(output_file&& other) noexcept;
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;

  // All of `bytes`, unbuffered; false (and from then on) once a write failed.
  bool write(std::string_view bytes);
  bool good() const { return fd_ >= 0 && good_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool good_ = true;
};

// Replaces `path`'s content with `bytes` (mode::replace); throws
// output_file_error naming the path.
void write_output_file(const std::string& path, std::string_view bytes);

// Writes `bytes` to `temporary` (whatever was there is removed first: a
// stale one, or a planted link, never its target), created exclusively,
// then renames it to `path`, so a reader never sees half of it and a link
// at `path` is replaced, not followed. Throws output_file_error naming the
// path; the temporary is removed on failure.
void replace_file_atomically(const std::string& path, const std::string& temporary,
                             std::string_view bytes);

}  // namespace troupe::monitoring
