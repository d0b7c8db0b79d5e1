// Writing checkpoints: the manifest, the atomic save, keep, and resolving
// the latest checkpoint.
#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "checkpoint/format.hpp"

namespace troupe::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; add byte swapping for this platform");

using namespace detail;
using nlohmann::json;

namespace {

// ---- manifest serialization --------------------------------------------------

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
      fd_guard fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
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
      fd_guard fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
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

std::optional<std::string> resolve(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  if (fs::is_regular_file(p / kManifest, ec)) return path;
  if (!fs::is_directory(p, ec)) return std::nullopt;
  auto all = list_checkpoints(p);
  if (all.empty()) return std::nullopt;
  return all.front().path.string();
}

}  // namespace troupe::checkpoint
