#include "monitoring/tensorboard_writer.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "monitoring/crc32c.hpp"

namespace troupe::monitoring {
namespace {

namespace fs = std::filesystem;

// Protobuf's wire format, the three kinds scalars need: varint (0),
// fixed64 (1), length-delimited (2), fixed32 (5).
enum wire_type : uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, wire_type type) {
  put_varint(out, (uint64_t{field} << 3) | type);
}

template <class T>
void put_little_endian(std::string& out, T v) {
  static_assert(std::is_unsigned_v<T>);
  for (std::size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, fixed64);
  put_little_endian(out, bits);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, fixed32);
  put_little_endian(out, bits);
}

void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, varint);
  put_varint(out, static_cast<uint64_t>(v));  // int64: two's complement, as protobuf does
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, length_delimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event's and Summary's field numbers (tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// A file no earlier file of this directory is, created exclusively
// (TensorBoard reads every events file of a run directory, in name order):
// a name taken by a file gets a suffix; one taken by a symbolic link is an
// error naming it, never written through.
output_file create_event_file(const fs::path& dir) {
  const auto seconds = static_cast<int64_t>(unix_seconds_now());
  const std::string base = "events.out.tfevents." + std::to_string(seconds) + "." + host_name();
  for (int k = 0;; ++k) {
    const fs::path p = dir / (k == 0 ? base : base + "." + std::to_string(k));
    std::error_code ec;
    const auto st = fs::symlink_status(p, ec);
    if (fs::exists(st) && !fs::is_symlink(st)) continue;
    try {
      return output_file(p.string(), output_file::mode::create_new);
    } catch (const output_file_error& e) {
      throw tensorboard_error(std::string("cannot write TensorBoard event file ") + e.what());
    }
  }
}

}  // namespace

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string encode_file_version_event(double wall_time) {
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_bytes(e, kEventFileVersion, "brain.Event:2");
  return e;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag,
                                float value) {
  std::string v;
  put_bytes(v, kValueTag, tag);
  put_float(v, kValueSimpleValue, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, v);
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_int64(e, kEventStep, step);
  put_bytes(e, kEventSummary, summary);
  return e;
}

std::string frame_record(const std::string& data) {
  std::string r;
  r.reserve(data.size() + 16);
  std::string length;
  put_little_endian(length, static_cast<uint64_t>(data.size()));
  r += length;
  put_little_endian(r, masked_crc32c(length.data(), length.size()));
  r += data;
  put_little_endian(r, masked_crc32c(data.data(), data.size()));
  return r;
}

tensorboard_writer::tensorboard_writer(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw tensorboard_error("cannot create TensorBoard directory '" + dir + "': " + ec.message());
  out_ = create_event_file(dir);
  write_record(encode_file_version_event(unix_seconds_now()));
}

void tensorboard_writer::add_scalar(const std::string& tag, float value, int64_t step,
                                    double wall_time) {
  if (!out_.good()) return;
  write_record(encode_scalar_event(wall_time, step, tag, value));
}

void tensorboard_writer::write_record(const std::string& data) {
  out_.write(frame_record(data));
}

}  // namespace troupe::monitoring
