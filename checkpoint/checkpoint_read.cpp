// Reading checkpoints: the manifest parsed and validated field by field,
// the tensors loaded against their checksums.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/format.hpp"
#include "config/json_limits.hpp"
#include "crypto/crypto.hpp"

namespace troupe::checkpoint {

using namespace detail;
using nlohmann::json;

namespace {

// Typed field access with messages that name the field.
class reader {
 public:
  explicit reader(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw checkpoint_error(where_ + ": " + (field.empty() ? "" : "field '" + field + "': ") +
                           problem);
  }
  const json& at(const json& j, const std::string& key, const std::string& field) const {
    auto it = j.find(key);
    if (it == j.end()) fail(field, "missing");
    return *it;
  }
  std::string str(const json& j, const std::string& key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_string()) fail(field, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  int64_t i64(const json& j, const std::string& key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(field, "out of range: " + v.dump());
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (!v.is_number_integer()) fail(field, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  bool boolean(const json& j, const std::string& key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_boolean()) fail(field, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  uint64_t u64(const json& j, const std::string& key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_number_unsigned()) fail(field, "expected a non-negative integer, got " + v.dump());
    return v.get<uint64_t>();
  }

 private:
  std::string where_;
};

// a * b, or nullopt when it overflows int64.
std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The step, epoch and position fields against each other and the directory
// name (a checkpoint is saved as ckpt-<step>; a copy under another name is
// not checked against it). save writes epoch = step / E and batch_in_epoch =
// step % E for the job's E updates per epoch (E = 0: epoch 0, batch = step),
// so E = (step - batch_in_epoch) / epoch must be a whole number > batch_in_epoch.
void check_position(const manifest& m, const std::string& dir, const std::string& where) {
  auto bad = [&](const char* field, int64_t v, const std::string& why) {
    throw checkpoint_error(where + ": manifest field \"" + field + "\" is " + std::to_string(v) +
                           " but " + why);
  };
  if (m.step < 0) bad("step", m.step, "a step count cannot be negative");
  if (m.epoch < 0) bad("epoch", m.epoch, "an epoch cannot be negative");
  if (m.batch_in_epoch < 0) bad("batch_in_epoch", m.batch_in_epoch, "it cannot be negative");
  fs::path name = fs::path(dir).filename().empty() ? fs::path(dir).parent_path() : fs::path(dir);
  if (auto named = parse_step(name.filename().string()); named && *named != m.step)
    bad("step", m.step, "the directory name says " + std::to_string(*named));
  if (m.batch_in_epoch > m.step)
    bad("batch_in_epoch", m.batch_in_epoch,
        "the step is only " + std::to_string(m.step) + " (the position lies beyond the step)");
  if (m.epoch == 0) {
    if (m.batch_in_epoch != m.step)
      bad("batch_in_epoch", m.batch_in_epoch,
          "in epoch 0 the position is the step, " + std::to_string(m.step));
    return;
  }
  if (m.epoch > m.step)
    bad("epoch", m.epoch,
        "the step is only " + std::to_string(m.step) + " (every epoch takes at least one step)");
  const int64_t whole = m.step - m.batch_in_epoch;
  if (whole % m.epoch != 0 || whole / m.epoch <= m.batch_in_epoch)
    bad("epoch", m.epoch,
        "step " + std::to_string(m.step) + " and batch_in_epoch " +
            std::to_string(m.batch_in_epoch) + " are not a position of any epoch length");
}

}  // namespace

std::string manifest_checksum(const nlohmann::json& manifest) {
  json copy = manifest;
  if (copy.is_object()) copy.erase(kChecksumField);
  return crypto::to_hex(crypto::sha256(copy.dump()));
}

namespace {

parsed_manifest parse_manifest_json(const std::string& text, const std::string& dir) {
  const std::string where = label(dir);
  // Refused before parsing: nothing recursive (destruction, dump) ever sees a
  // deep document.
  if (json_nesting_depth(text, /*comments=*/false) > kMaxJsonDepth)
    throw checkpoint_error(where + ": " + kManifest + ": JSON nested too deeply (more than " +
                           std::to_string(kMaxJsonDepth) +
                           " levels of [ and {); not a manifest troupe wrote");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw checkpoint_error(where + ": " + kManifest + ": invalid JSON: " + e.what());
  }
  reader r(where + ": " + kManifest);
  if (!j.is_object()) r.fail("", "expected a JSON object, got " + std::string(j.type_name()));

  parsed_manifest p;
  manifest& m = p.meta;
  int64_t version = r.i64(j, "format_version", "format_version");
  if (version != kFormatVersion && version != 1)
    r.fail("", "unsupported format_version " + std::to_string(version) +
                   " (this build reads versions 1 and " + std::to_string(kFormatVersion) + ")");
  m.format_version = static_cast<int>(version);
  if (version >= 2) {
    // The manifest's own checksum: SHA-256 of its canonical (compact, sorted
    // keys) dump without this field. Without it one flipped digit in "step"
    // would resume at the wrong step with valid-looking tensors.
    auto it = j.find(kChecksumField);
    if (it == j.end() || !it->is_string())
      r.fail(kChecksumField, "missing (a format_version 2 manifest carries its own checksum)");
    std::string stored = it->get<std::string>();
    std::string computed;
    try {
      computed = manifest_checksum(j);
    } catch (const json::exception& e) {
      r.fail("", std::string("cannot be checksummed: ") + e.what());
    }
    if (stored != computed)
      throw checkpoint_error(where + ": " + kManifest + ": manifest checksum mismatch (field \"" +
                             kChecksumField + "\" is " + stored.substr(0, 64) +
                             ", the content hashes to " + computed +
                             "): the manifest was modified or damaged");
  }
  m.job = r.str(j, "job", "job");
  m.strategy = r.str(j, "strategy", "strategy");
  m.step = r.i64(j, "step", "step");
  m.epoch = r.i64(j, "epoch", "epoch");
  m.batch_in_epoch = r.i64(j, "batch_in_epoch", "batch_in_epoch");
  check_position(m, dir, where);
  if (j.contains("slots_count_own_steps"))
    m.slots_count_own_steps = r.boolean(j, "slots_count_own_steps", "slots_count_own_steps");
  if (j.contains("config")) m.config = j["config"];
  if (j.contains("extra")) m.extra = j["extra"];
  p.tensors_bytes = r.u64(j, "tensors_bytes", "tensors_bytes");

  const json& tensors = r.at(j, "tensors", "tensors");
  if (!tensors.is_array()) r.fail("tensors", "expected an array");
  std::set<std::pair<std::string, std::string>> seen;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const json& t = tensors[i];
    std::string f = "tensors[" + std::to_string(i) + "]";
    if (!t.is_object()) r.fail(f, "expected an object");
    entry e;
    e.name = r.str(t, "name", f + ".name");
    e.kind = r.str(t, "kind", f + ".kind");
    if (e.kind != "variable" && e.kind != "slot" && e.kind != "state")
      r.fail(f + ".kind", "unknown kind '" + e.kind + "' (expected variable, slot or state)");
    if (!seen.insert({e.kind, e.name}).second)
      r.fail(f, "duplicate " + e.kind + " '" + e.name + "'");
    try {
      e.type = parse_dtype(r.str(t, "dtype", f + ".dtype"));
    } catch (const std::invalid_argument& ex) {
      r.fail(f + ".dtype", ex.what());
    }
    const json& shape = r.at(t, "shape", f + ".shape");
    if (!shape.is_array()) r.fail(f + ".shape", "expected an array");
    // Every dimension >= 0, and the element count and byte size fit an
    // int64 (checked, not wrapped: a wrapped product could match nbytes).
    int64_t numel = 1;
    for (const auto& d : shape) {
      if (d.is_number_integer() && !d.is_number_unsigned())
        r.fail(f + ".shape", "negative dimension " + d.dump());
      if (!d.is_number_unsigned()) r.fail(f + ".shape", "bad dimension " + d.dump());
      if (d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        r.fail(f + ".shape", "dimension " + d.dump() + " does not fit an int64");
      e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
      auto n = checked_mul(numel, e.shape.back());
      if (!n) r.fail(f + ".shape", "the element count of " + shape.dump() + " overflows int64");
      numel = *n;
    }
    auto bytes = checked_mul(numel, static_cast<int64_t>(dtype_size(e.type)));
    if (!bytes)
      r.fail(f + ".shape", std::string("the byte size of ") + dtype_name(e.type) + " " +
                               shape.dump() + " overflows int64");
    e.offset = r.u64(t, "offset", f + ".offset");
    e.nbytes = r.u64(t, "nbytes", f + ".nbytes");
    // A default (empty) tensor is saved with shape [] and 0 bytes.
    if (!(e.shape.empty() && e.nbytes == 0) && static_cast<uint64_t>(*bytes) != e.nbytes)
      r.fail(f, e.kind + " '" + e.name + "': " + std::to_string(e.nbytes) + " bytes stored, but " +
                    dtype_name(e.type) + " " + shape_string(e.shape) + " needs " +
                    std::to_string(*bytes));
    uint64_t crc = r.u64(t, "crc32", f + ".crc32");
    if (crc > 0xffffffffULL) r.fail(f + ".crc32", "out of range");
    e.crc32 = static_cast<uint32_t>(crc);
    m.entries.push_back(std::move(e));
  }
  return p;
}

}  // namespace

namespace detail {

parsed_manifest parse_manifest(const std::string& dir) {
  const std::string where = label(dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw checkpoint_error(where + ": no such directory");
  if (!fs::is_directory(dir, ec)) throw checkpoint_error(where + ": not a directory");
  fs::path file = fs::path(dir) / kManifest;
  if (!fs::exists(file, ec))
    throw checkpoint_error(where + ": " + kManifest +
                           " is missing (not a checkpoint directory, or it was damaged)");
  uint64_t size = fs::file_size(file, ec);
  if (ec) throw checkpoint_error(where + ": " + kManifest + ": " + ec.message());
  if (size > kMaxManifestBytes)
    throw checkpoint_error(where + ": " + kManifest + " is " + std::to_string(size) +
                           " bytes, more than any manifest (limit " +
                           std::to_string(kMaxManifestBytes) + ")");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw checkpoint_error(where + ": cannot open " + kManifest);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw checkpoint_error(where + ": cannot read " + kManifest);
  return parse_manifest_json(text, dir);
}

}  // namespace detail

manifest read_manifest(const std::string& dir) {
  return parse_manifest(dir).meta;
}

manifest parse_manifest_text(const std::string& text, const std::string& dir) {
  return parse_manifest_json(text, dir).meta;
}

snapshot load(const std::string& dir) {
  const std::string where = label(dir);
  parsed_manifest p = parse_manifest(dir);
  snapshot s;
  s.meta = p.meta;
  s.dir = dir;

  const fs::path file = fs::path(dir) / kTensors;
  std::error_code ec;
  if (!fs::exists(file, ec)) throw checkpoint_error(where + ": " + kTensors + " is missing");
  uint64_t size = fs::file_size(file, ec);
  if (ec) throw checkpoint_error(where + ": " + kTensors + ": " + ec.message());
  if (size != p.tensors_bytes)
    throw checkpoint_error(where + ": " + kTensors + " is " + std::to_string(size) +
                           " bytes, the manifest expects " + std::to_string(p.tensors_bytes) +
                           (size < p.tensors_bytes ? " (truncated)" : ""));
  fd_guard fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) sys_fail(where + ": cannot open " + kTensors);

  for (const entry& e : s.meta.entries) {
    const std::string what = where + ": " + e.kind + " '" + e.name + "'";
    if (e.offset > size || e.nbytes > size - e.offset)
      throw checkpoint_error(what + ": bytes [" + std::to_string(e.offset) + ", " +
                             std::to_string(e.offset + e.nbytes) + ") lie outside " + kTensors +
                             " (" + std::to_string(size) + " bytes)");
    tensor t;
    if (!(e.shape.empty() && e.nbytes == 0)) {  // else a default (empty) tensor
      // parse_manifest checked that nbytes is the shape's size (no overflow),
      // and it lies inside tensors.bin, whose size is known: no allocation
      // larger than the file.
      t = tensor(e.shape, e.type);
      read_at(fd.get(), t.raw(), e.nbytes, e.offset, what + ": reading " + kTensors);
    }
    uint32_t crc = crc_of(t.raw(), e.nbytes);
    if (crc != e.crc32)
      throw checkpoint_error(what + ": checksum mismatch (stored " + hex32(e.crc32) +
                             ", computed " + hex32(crc) + ")");
    named_tensor nt{e.name, std::move(t)};
    if (e.kind == "variable")
      s.variables.push_back(std::move(nt));
    else if (e.kind == "slot")
      s.slots.push_back(std::move(nt));
    else
      s.state.push_back(std::move(nt));
  }
  // The optimizer counts its own updates: its "optimizer/step" slot is the
  // checkpoint's step, or at most the step when the slots are one replica's
  // that took only its share of the steps (and in a manifest that does not
  // say).
  const bool own_share = s.meta.slots_count_own_steps.value_or(true);
  for (const auto& nt : s.slots)
    if (nt.name == "optimizer/step" && nt.value.type() == dtype::i64 && nt.value.numel() == 1) {
      const int64_t counted = nt.value.data<int64_t>()[0];
      if (own_share ? (counted < 0 || counted > s.meta.step) : counted != s.meta.step)
        throw checkpoint_error(where + ": manifest field \"step\" is " +
                               std::to_string(s.meta.step) + " but the slot 'optimizer/step' is " +
                               std::to_string(counted));
    }
  if (s.meta.format_version < 2)
    spdlog::warn(
        "{}: written by an older troupe (format_version {}, no manifest checksum); accepted "
        "because its step, epoch, shapes and tensor checksums agree",
        where, s.meta.format_version);
  return s;
}

}  // namespace troupe::checkpoint
