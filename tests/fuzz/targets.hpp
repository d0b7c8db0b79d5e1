#pragma once
// The parsers of untrusted files, each as one function over raw bytes: it
// returns true when the input is accepted, false when the parser refused it
// with the project's own error type, and lets anything else escape (a crash
// or another exception is the bug a fuzzer looks for). Used by the libFuzzer
// targets in this directory and by the deterministic mutation tests in the
// normal test suite.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.hpp"
#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "data/csv.hpp"
#include "data/idx.hpp"
#include "data/npy.hpp"

namespace troupe::fuzz {

// A job config file's text.
inline bool config_text(std::string_view text) {
  try {
    (void)parse_job_config_text(std::string(text), "fuzz.json");
    return true;
  } catch (const config_error&) {
    return false;
  }
}

// A job config with a cluster spec, and what troupe launch/node derive from
// it: the placement of every task and every task's address.
inline bool cluster_text(std::string_view text) {
  try {
    job_config c = parse_job_config_text(std::string(text), "fuzz.json");
    if (!c.cluster) return true;
    auto placement = resolve_placement(c);
    for (const auto& task : all_tasks(*c.cluster)) {
      (void)placement_of(placement, task);
      (void)parse_host_port(task_address(*c.cluster, task));
      (void)parse_task_name(task.str());
    }
    return true;
  } catch (const config_error&) {
    return false;
  }
}

// A checkpoint manifest's text (of a directory not named ckpt-<step>, so no
// step is implied by the name).
inline bool manifest_text(std::string_view text) {
  try {
    (void)checkpoint::parse_manifest_text(std::string(text), "fuzz/checkpoint");
    return true;
  } catch (const checkpoint::checkpoint_error&) {
    return false;
  }
}

namespace detail {
// The bytes as a temporary file, removed when this goes out of scope (the
// data readers read files: they map them).
struct temp_file {
  std::filesystem::path path;
  bool ok = false;
  temp_file(std::string_view bytes, const char* ext) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("troupe-fuzz-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ext);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return;
    ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    ok = std::fclose(f) == 0 && ok;
  }
  ~temp_file() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
};
}  // namespace detail

// An IDX file (header and data; plain or gzip), through both readers.
inline bool idx_file(std::string_view bytes) {
  detail::temp_file file(bytes, ".idx");
  if (!file.ok) return false;
  const auto& path = file.path;
  bool ok = true;
  for (int which = 0; which < 2; ++which) try {
      if (which == 0)
        (void)data::read_idx_dims(path.string());
      else
        (void)data::read_idx(path.string());
    } catch (const data::data_error&) {
      ok = false;
    }
  return ok;
}

// Reads every element, so that a wrong bound shows as a sanitizer report.
inline uint64_t touch(const data::npy_array& a) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < a.nbytes; ++i) sum += a.data[i];
  return sum;
}

// A .npy file.
inline bool npy_file(std::string_view bytes) {
  detail::temp_file file(bytes, ".npy");
  if (!file.ok) return false;
  try {
    (void)touch(data::read_npy(file.path.string()));
    return true;
  } catch (const data::data_error&) {
    return false;
  }
}

// An .npz archive holding the arrays "x" and "y".
inline bool npz_file(std::string_view bytes) {
  detail::temp_file file(bytes, ".npz");
  if (!file.ok) return false;
  try {
    for (const auto& a : data::read_npz(file.path.string(), {"x", "y"})) (void)touch(a);
    return true;
  } catch (const data::data_error&) {
    return false;
  }
}

// A CSV table with the label in column "label".
inline bool csv_file(std::string_view bytes) {
  detail::temp_file file(bytes, ".csv");
  if (!file.ok) return false;
  try {
    (void)data::read_csv(file.path.string(), "label");
    return true;
  } catch (const data::data_error&) {
    return false;
  }
}

}  // namespace troupe::fuzz
