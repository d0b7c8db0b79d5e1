#pragma once
// What the checkpoint sources (checkpoint/*.cpp) share: the file names and
// layout constants, POSIX file helpers (fsync needs a descriptor), checksums,
// checkpoint directory names, and the parsed manifest.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace troupe::checkpoint::detail {

namespace fs = std::filesystem;

inline constexpr uint64_t kAlign = 64;
inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kTensors = "tensors.bin";
inline constexpr const char* kChecksumField = "manifest_sha256";
// A manifest is a few hundred bytes per tensor; anything this large is not one.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

std::string hex32(uint32_t v);
uint32_t crc_of(const void* data, uint64_t n);

class fd_guard {
 public:
  explicit fd_guard(int fd) : fd_(fd) {}
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

[[noreturn]] void sys_fail(const std::string& what);
void write_all(int fd, const void* data, uint64_t n, const std::string& file);
void close_synced(fd_guard& fd, const std::string& file);
void fsync_dir(const fs::path& dir);
void read_at(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& what);

// The step of a checkpoint directory named ckpt-<step>.
std::optional<int64_t> parse_step(const std::string& name);

struct found {
  int64_t step;
  fs::path path;
};
// The checkpoints under `root`, latest first.
std::vector<found> list_checkpoints(const fs::path& root);

// How errors name a checkpoint.
std::string label(const std::string& dir);

struct parsed_manifest {
  manifest meta;
  uint64_t tensors_bytes = 0;
};
// The manifest of checkpoint `dir`, checked (checkpoint_read.cpp).
parsed_manifest parse_manifest(const std::string& dir);

}  // namespace troupe::checkpoint::detail
