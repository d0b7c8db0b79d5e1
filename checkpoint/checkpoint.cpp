#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "config/json_limits.hpp"
#include "config/secret.hpp"

namespace troupe::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; add byte swapping for this platform");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kAlign = 64;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kTensors = "tensors.bin";
constexpr const char* kChecksumField = "manifest_sha256";
// A manifest is a few hundred bytes per tensor; anything this large is not one.
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
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

// ---- POSIX file helpers (fsync needs a descriptor) -------------------------

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

// ---- names -----------------------------------------------------------------

std::optional<int64_t> parse_step(const std::string& name) {
  static const std::string prefix = "ckpt-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return {};
  std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return {};
  return std::stoll(digits);
}

struct found {
  int64_t step;
  fs::path path;
};

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

// ---- manifest (de)serialization ---------------------------------------------

json to_json(const manifest& m, const std::vector<entry>& entries, uint64_t total) {
  json t = json::array();
  for (const auto& e : entries)
    t.push_back({{"name", e.name},
                 {"kind", e.kind},
                 {"dtype", dtype_name(e.type)},
                 {"shape", e.shape},
                 {"offset", e.offset},
                 {"nbytes", e.nbytes},
                 {"crc32", e.crc32}});
  json j{{"format_version", kFormatVersion},
         {"job", m.job},
         {"strategy", m.strategy},
         {"step", m.step},
         {"epoch", m.epoch},
         {"batch_in_epoch", m.batch_in_epoch},
         {"slots_count_own_steps", m.slots_count_own_steps.value_or(false)},
         {"tensors_file", kTensors},
         {"tensors_bytes", total},
         {"config", m.config},
         {"extra", m.extra},
         {"tensors", t}};
  j[kChecksumField] = manifest_checksum(j);
  return j;
}

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

struct parsed_manifest {
  manifest meta;
  uint64_t tensors_bytes = 0;
};

std::string label(const std::string& dir) {
  return "checkpoint " + dir;
}

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
  return to_hex(sha256(copy.dump()));
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

// After a successful save: .ckpt-<step>.tmp-<pid> and .ckpt-<step>.old-<pid>
// directories of another process are what a crashed save left behind (this
// process's own are its saves in progress, which it cleans up itself).
void remove_stale_temporaries(const fs::path& root, const std::string& own_pid) {
  std::error_code ec;
  fs::directory_iterator it(root, ec), end;
  if (ec) return;
  std::vector<fs::path> stale;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (!name.starts_with(".ckpt-")) continue;
    std::size_t mark = name.rfind(".tmp-");
    if (mark == std::string::npos) mark = name.rfind(".old-");
    if (mark == std::string::npos || !parse_step(name.substr(1, mark - 1))) continue;
    const std::string pid = name.substr(mark + 5);
    if (pid.empty() || pid == own_pid ||
        !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    stale.push_back(it->path());
  }
  for (const auto& p : stale) {
    std::error_code rm;
    fs::remove_all(p, rm);
    if (rm)
      spdlog::warn("checkpoint: cannot remove the stale temporary directory {}: {}", p.string(),
                   rm.message());
    else
      spdlog::info(
          "checkpoint: removed the stale temporary directory {} (a save that did not "
          "finish)",
          p.string());
  }
}

}  // namespace

std::string dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%010lld", static_cast<long long>(step));
  return buf;
}

manifest read_manifest(const std::string& dir) {
  return parse_manifest(dir).meta;
}

manifest parse_manifest_text(const std::string& text, const std::string& dir) {
  return parse_manifest_json(text, dir).meta;
}

std::string save(const std::string& root, const snapshot& s, int64_t keep) {
  const fs::path root_p = root.empty() ? fs::path(".") : fs::path(root);
  const std::string name = dir_name(s.meta.step);
  const std::string where = label((root_p / name).string());
  if (s.meta.step < 0)
    throw checkpoint_error(where + ": negative step " + std::to_string(s.meta.step));

  // Lay out the tensors.
  std::vector<entry> entries;
  std::vector<const tensor*> values;
  std::set<std::pair<std::string, std::string>> seen;
  uint64_t end = 0;
  auto add = [&](const std::vector<named_tensor>& list, const char* kind) {
    for (const auto& nt : list) {
      if (nt.name.empty()) throw checkpoint_error(where + ": a " + kind + " has an empty name");
      if (!seen.insert({kind, nt.name}).second)
        throw checkpoint_error(where + ": " + kind + " '" + nt.name + "': duplicate name");
      entry e;
      e.name = nt.name;
      e.kind = kind;
      e.shape = nt.value.shape();
      e.type = nt.value.type();
      e.offset = (end + kAlign - 1) / kAlign * kAlign;
      e.nbytes = nt.value.nbytes();
      e.crc32 = crc_of(nt.value.raw(), e.nbytes);
      end = e.offset + e.nbytes;
      entries.push_back(std::move(e));
      values.push_back(&nt.value);
    }
  };
  add(s.variables, "variable");
  add(s.slots, "slot");
  add(s.state, "state");

  std::error_code ec;
  fs::create_directories(root_p, ec);
  if (ec)
    throw checkpoint_error(where + ": cannot create " + root_p.string() + ": " + ec.message());
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = root_p / ("." + name + ".tmp-" + pid);
  const fs::path final_dir = root_p / name;
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec)
    throw checkpoint_error(where + ": cannot create " + tmp.string() + ": " + ec.message());

  try {
    {
      const fs::path file = tmp / kTensors;
      fd_guard fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (fd.get() < 0) sys_fail(where + ": cannot create " + file.string());
      static const char zeros[kAlign] = {};
      uint64_t pos = 0;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        write_all(fd.get(), zeros, entries[i].offset - pos, file.string());
        write_all(fd.get(), values[i]->raw(), entries[i].nbytes, file.string());
        pos = entries[i].offset + entries[i].nbytes;
      }
      close_synced(fd, file.string());
    }
    {
      const fs::path file = tmp / kManifest;
      std::string text = to_json(s.meta, entries, end).dump(2) + "\n";
      fd_guard fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (fd.get() < 0) sys_fail(where + ": cannot create " + file.string());
      write_all(fd.get(), text.data(), text.size(), file.string());
      close_synced(fd, file.string());
    }
    fsync_dir(tmp);

    if (fs::exists(final_dir, ec)) {
      // Same step saved again: move the old one aside, then swap in the new.
      const fs::path old = root_p / ("." + name + ".old-" + pid);
      fs::remove_all(old, ec);
      fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      fs::remove_all(old, ec);
    } else {
      fs::rename(tmp, final_dir);
    }
    fsync_dir(root_p);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw checkpoint_error(where + ": " + e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }

  remove_stale_temporaries(root_p, pid);

  if (keep > 0) {
    int64_t kept = 1;  // the one just written
    for (const auto& f : list_checkpoints(root_p)) {
      if (f.path.filename() == name) continue;
      if (kept < keep) {
        ++kept;
        continue;
      }
      fs::remove_all(f.path, ec);
    }
  }
  return final_dir.string();
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

std::optional<std::string> resolve(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  if (fs::is_regular_file(p / kManifest, ec)) return path;
  if (!fs::is_directory(p, ec)) return std::nullopt;
  auto all = list_checkpoints(p);
  if (all.empty()) return std::nullopt;
  return all.front().path.string();
}

namespace {

std::optional<std::string> resolve_or_report(const std::string& path, const char* cmd,
                                             std::ostream& err) {
  auto dir = resolve(path);
  if (!dir)
    err << "troupe checkpoint " << cmd << ": no checkpoint at '" << path
        << "' (expected a checkpoint directory or one holding ckpt-* directories)\n";
  return dir;
}

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

double value_at(const tensor& t, std::size_t i) {
  switch (t.type()) {
    case dtype::f32:
      return static_cast<const float*>(t.raw())[i];
    case dtype::i32:
      return static_cast<const int32_t*>(t.raw())[i];
    case dtype::i64:
      return static_cast<double>(static_cast<const int64_t*>(t.raw())[i]);
  }
  return 0;
}

}  // namespace

int show(const std::string& path, std::ostream& out, std::ostream& err) {
  auto dir = resolve_or_report(path, "show", err);
  if (!dir) return 1;
  try {
    manifest m = read_manifest(*dir);
    uint64_t total = 0;
    for (const auto& e : m.entries) total += e.nbytes;
    out << "checkpoint " << *dir << "\n"
        << "job: " << m.job << "  strategy: " << m.strategy << "  step: " << m.step
        << "  epoch: " << m.epoch << "  batch_in_epoch: " << m.batch_in_epoch << "\n"
        << "format_version: " << m.format_version << "  tensors: " << m.entries.size()
        << "  bytes: " << total << "\n";
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "KIND", "DTYPE", "SHAPE", "BYTES", "CRC32"}};
    for (const auto& e : m.entries)
      rows.push_back({e.name, e.kind, dtype_name(e.type), shape_string(e.shape),
                      std::to_string(e.nbytes), hex32(e.crc32)});
    print_table(out, rows);
    load(*dir);
    out << "verified: " << m.entries.size() << " checksums match\n";
    return 0;
  } catch (const checkpoint_error& e) {
    err << "error: " << e.what() << "\n";
    return 1;
  }
}

int diff(const std::string& a, const std::string& b, std::ostream& out, std::ostream& err) {
  auto da = resolve_or_report(a, "diff", err);
  auto db = resolve_or_report(b, "diff", err);
  if (!da || !db) return 1;
  snapshot sa, sb;
  try {
    sa = load(*da);
    sb = load(*db);
  } catch (const checkpoint_error& e) {
    err << "error: " << e.what() << "\n";
    return 1;
  }
  out << "A: " << *da << " (step " << sa.meta.step << ")\n"
      << "B: " << *db << " (step " << sb.meta.step << ")\n";

  std::map<std::string, const tensor*> in_b;
  for (const auto& v : sb.variables) in_b[v.name] = &v.value;
  std::set<std::string> in_a;
  double all_abs = 0, all_rel = 0;
  int64_t common = 0, only_a = 0, only_b = 0, mismatched = 0;
  std::vector<std::vector<std::string>> rows = {{"VARIABLE", "MAX_ABS", "MAX_REL"}};
  std::vector<std::string> notes;
  for (const auto& v : sa.variables) {
    in_a.insert(v.name);
    auto it = in_b.find(v.name);
    if (it == in_b.end()) {
      notes.push_back("only in A: " + v.name + " " + dtype_name(v.value.type()) + " " +
                      shape_string(v.value.shape()));
      ++only_a;
      continue;
    }
    const tensor& ta = v.value;
    const tensor& tb = *it->second;
    if (ta.shape() != tb.shape() || ta.type() != tb.type()) {
      notes.push_back("shape differs: " + v.name + ": A " + dtype_name(ta.type()) + " " +
                      shape_string(ta.shape()) + ", B " + dtype_name(tb.type()) + " " +
                      shape_string(tb.shape()));
      ++mismatched;
      continue;
    }
    double max_abs = 0, max_rel = 0;
    const auto n = static_cast<std::size_t>(ta.numel());
    for (std::size_t i = 0; i < n; ++i) {
      double x = value_at(ta, i), y = value_at(tb, i);
      if (x == y || (std::isnan(x) && std::isnan(y))) continue;
      double d = std::fabs(x - y);
      if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
      double rel = d / std::max({std::fabs(x), std::fabs(y), 1e-12});
      if (std::isnan(rel)) rel = std::numeric_limits<double>::infinity();
      max_abs = std::max(max_abs, d);
      max_rel = std::max(max_rel, rel);
    }
    ++common;
    all_abs = std::max(all_abs, max_abs);
    all_rel = std::max(all_rel, max_rel);
    rows.push_back({v.name, num(max_abs), num(max_rel)});
  }
  for (const auto& v : sb.variables)
    if (!in_a.count(v.name)) {
      notes.push_back("only in B: " + v.name + " " + dtype_name(v.value.type()) + " " +
                      shape_string(v.value.shape()));
      ++only_b;
    }
  print_table(out, rows);
  for (const auto& n : notes) out << n << "\n";
  out << "overall: max_abs " << num(all_abs) << "  max_rel " << num(all_rel) << " over " << common
      << " common variables (" << only_a << " only in A, " << only_b << " only in B, " << mismatched
      << " with different shapes)\n";
  return 0;
}

}  // namespace troupe::checkpoint
