#pragma once
// Checkpoints: a directory <root>/ckpt-<step, 10 digits>/ holding manifest.json
// (job, strategy, position, config, and one entry per tensor) and tensors.bin
// (every tensor's raw little-endian bytes, each at a 64-byte-aligned offset,
// with a crc32 per tensor in the manifest). A checkpoint is written to
// <root>/.ckpt-<step>.tmp-<pid>/, fsynced, and renamed into place, so a crash
// never leaves a half-written checkpoint as the latest one; the next
// successful save removes what a crashed one left (another process's .tmp-).
//
// Format 2 (this build writes it): the manifest carries "manifest_sha256",
// the SHA-256 of its canonical dump without that field (manifest_checksum),
// verified on every read. Every read also cross-checks step, epoch and
// batch_in_epoch against each other and the ckpt-<step> directory name, each
// shape's element count and byte size (overflow-checked) against nbytes and
// the tensors file, and (load) "optimizer/step" against step. Format 1
// (older troupe, no manifest checksum) is read when all of these agree.
// Manifests nested more than kMaxJsonDepth deep are refused unparsed.
#include <cstdint>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/tensor.hpp"

namespace troupe::checkpoint {

// Any problem saving or loading; what() names the checkpoint, the file and,
// where there is one, the tensor: "checkpoint runs/x/ckpt-0000000100: variable
// 'dense_0/kernel': checksum mismatch (stored 0x1234abcd, computed 0x...)".
class checkpoint_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct entry {
  std::string name;
  std::string kind;  // "variable" | "slot" | "state"
  shape_t shape;
  dtype type = dtype::f32;
  uint64_t offset = 0;  // in tensors.bin, a multiple of 64
  uint64_t nbytes = 0;
  uint32_t crc32 = 0;
};

struct manifest {
  int format_version = 1;
  std::string job;
  std::string strategy;
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;
  // The optimizer slots are one replica's, which counted only its own share
  // of the steps (its "optimizer/step" is at most `step`), not every step.
  // The saver says so (strategy::snapshot_slots_count_own_steps); saved as
  // false when unset. Absent from manifests written before the field: either
  // count is accepted there.
  std::optional<bool> slots_count_own_steps;
  nlohmann::json config;       // the effective job config
  nlohmann::json extra;        // anything else the trainer wants back on resume
  std::vector<entry> entries;  // filled by save (on disk) and load; ignored by save
};

struct snapshot {
  manifest meta;
  std::vector<named_tensor> variables;
  std::vector<named_tensor> slots;  // optimizer slots
  std::vector<named_tensor> state;  // anything else (e.g. RNG state, counters)
  std::string dir;                  // where load() read it from ("" when built in memory)
};

constexpr int kFormatVersion = 2;

// "ckpt-0000000100" for step 100.
std::string dir_name(int64_t step);

// Writes s atomically as <root>/ckpt-<step>/ (replacing one of the same step),
// then deletes the oldest ckpt-* directories beyond `keep` (0 = keep all; the
// one just written is always kept). Returns the checkpoint's directory.
std::string save(const std::string& root, const snapshot& s, int64_t keep);

// Reads and verifies a checkpoint directory: manifest present and parseable,
// known format_version, tensors.bin size, every entry's range and crc32.
snapshot load(const std::string& dir);

// Reads and validates only manifest.json (entries included, tensors unread).
manifest read_manifest(const std::string& dir);

// The same checks on a manifest's text, as if it were `dir`'s manifest.json
// (for tests and fuzzing; reads no file).
manifest parse_manifest_text(const std::string& text, const std::string& dir);

// SHA-256 (hex) of a manifest's compact dump without its "manifest_sha256"
// field: the value that field must hold.
std::string manifest_checksum(const nlohmann::json& manifest);

// A checkpoint directory (holds manifest.json) -> itself; a directory holding
// ckpt-* directories -> the one with the highest step; otherwise nullopt.
// Temporary (.ckpt-*.tmp-*) directories are ignored.
std::optional<std::string> resolve(const std::string& path);

// `troupe checkpoint show PATH`: the header and one line per tensor, then
// verifies the checksums. Returns the exit code (0 ok, 1 error).
int show(const std::string& path, std::ostream& out, std::ostream& err = std::cerr);

// `troupe checkpoint diff A B`: per common variable max |a-b| and max relative
// difference, variables only in one or with different shapes, and an overall
// line. Returns 0 (differences are not an error), 1 if one can't be read.
int diff(const std::string& a, const std::string& b, std::ostream& out,
         std::ostream& err = std::cerr);

}  // namespace troupe::checkpoint
