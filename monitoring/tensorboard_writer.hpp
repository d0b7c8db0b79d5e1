#pragma once
// One TensorBoard event file: what tf.summary writes for scalars, without
// TensorFlow or a protobuf library. The file is a sequence of records
//   uint64 length | uint32 masked CRC-32C of length | data | uint32 masked CRC-32C of data
// (little-endian), each data an `Event` protobuf message:
//   wall_time (1, double), step (2, int64), file_version (3, string; the
//   first record's, "brain.Event:2"), summary (5, Summary: repeated value (1,
//   Value: tag (1, string), simple_value (2, float))).
// Every record is flushed when written, so TensorBoard shows a running job.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "monitoring/output_file.hpp"

namespace troupe::monitoring {

class tensorboard_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The Event messages, encoded (exposed for the tests of the file format).
std::string encode_file_version_event(double wall_time);
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag,
                                float value);
// One record of the file around an encoded event.
std::string frame_record(const std::string& data);

class tensorboard_writer {
 public:
  // Creates `dir` and the file events.out.tfevents.<unix seconds>.<hostname>
  // in it (a suffix when a file has that name), created exclusively and never
  // through a symbolic link (monitoring/output_file.hpp), and writes the
  // file_version record. Throws tensorboard_error naming the path.
  explicit tensorboard_writer(const std::string& dir);
  const std::string& path() const { return out_.path(); }
  // False once a write failed (a full disk): later scalars are dropped.
  bool good() const { return out_.good(); }
  void add_scalar(const std::string& tag, float value, int64_t step, double wall_time);

 private:
  void write_record(const std::string& data);

  output_file out_;
};

// Seconds since the Unix epoch, as Event.wall_time holds them.
double unix_seconds_now();

}  // namespace troupe::monitoring
