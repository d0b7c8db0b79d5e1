#include "monitoring/tensorboard_sink.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "monitoring/metrics_line.hpp"

namespace troupe::monitoring {
namespace {

namespace fs = std::filesystem;

constexpr const char* kJobRun = "job";

bool is_event_file(const fs::path& p) {
  return p.filename().string().rfind("events.out.tfevents.", 0) == 0;
}

// Only files named as this writer names them, one level down: nothing else
// of the directory is touched.
void remove_earlier_event_files(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& run : fs::directory_iterator(dir, ec)) {
    if (!run.is_directory(ec)) continue;
    for (const auto& f : fs::directory_iterator(run.path(), ec))
      if (f.is_regular_file(ec) && is_event_file(f.path())) fs::remove(f.path(), ec);
  }
}

std::string run_of(const line_scalars& s) {
  if (s.role_key.empty()) return kJobRun;
  return s.role_key + "_" + std::to_string(s.role_index);
}

}  // namespace

tensorboard_sink::tensorboard_sink(std::string dir, bool fresh) : dir_(std::move(dir)) {
  if (fresh) remove_earlier_event_files(dir_);
  auto w = std::make_unique<tensorboard_writer>((fs::path(dir_) / kJobRun).string());
  spdlog::info("TensorBoard events: {} (tensorboard --logdir {})", w->path(), dir_);
  writers_.emplace(kJobRun, std::move(w));
}

tensorboard_writer* tensorboard_sink::writer_for(const std::string& run) {
  auto it = writers_.find(run);
  if (it != writers_.end()) return it->second.get();
  try {
    auto w = std::make_unique<tensorboard_writer>((fs::path(dir_) / run).string());
    return writers_.emplace(run, std::move(w)).first->second.get();
  } catch (const tensorboard_error& e) {
    if (!warned_) spdlog::warn("TensorBoard: {}; its scalars are dropped", e.what());
    warned_ = true;
    writers_.emplace(run, nullptr);  // tried once
    return nullptr;
  }
}

void tensorboard_sink::write(const nlohmann::json& line, int64_t step) {
  auto s = scalars_of(line, step);
  if (!s || s->fields.empty()) return;
  auto* w = writer_for(run_of(*s));
  if (!w) return;
  const double now = unix_seconds_now();
  for (const auto& [field, value] : s->fields)
    w->add_scalar(s->type + "/" + field, static_cast<float>(value), s->step, now);
  if (!w->good() && !warned_) {
    spdlog::warn("TensorBoard: writing {} failed; its scalars are dropped", w->path());
    warned_ = true;
  }
}

}  // namespace troupe::monitoring
