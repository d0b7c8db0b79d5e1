#include "runtime/checkpointing.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "monitoring/output_file.hpp"
#include "runtime/preemption.hpp"
#include "strategies/strategy.hpp"

namespace troupe {

namespace fs = std::filesystem;

namespace {

// The first variable holding a NaN or an infinity, if any: such a checkpoint
// is not written, so that the last good one stays (keep rotation would
// otherwise push it out with diverged weights).
std::optional<std::string> first_non_finite(const std::vector<named_tensor>& vars) {
  for (const auto& v : vars) {
    if (v.value.type() != dtype::f32) continue;
    for (float x : v.value.span<float>())
      if (!std::isfinite(x)) return v.name;
  }
  return std::nullopt;
}

}  // namespace

std::string save_job_checkpoint(const job_plan& p, int64_t step, model_state& ms,
                                nlohmann::json extra) {
  if (auto bad = first_non_finite(ms.variables))
    throw job_error("training diverged: variable '" + *bad +
                    "' holds NaN or infinite values at step " + std::to_string(step) +
                    "; no checkpoint written, the last one in " + p.checkpoint_dir + " is kept");
  checkpoint::snapshot snap;
  snap.meta.job = p.config.name;
  snap.meta.strategy = p.config.strategy.kind;
  snap.meta.step = step;
  snap.meta.epoch = p.steps_per_epoch > 0 ? step / p.steps_per_epoch : 0;
  snap.meta.batch_in_epoch = p.steps_per_epoch > 0 ? step % p.steps_per_epoch : step;
  snap.meta.slots_count_own_steps = p.strat->snapshot_slots_count_own_steps();
  snap.meta.config = to_json(p.config);
  snap.meta.extra = std::move(extra);
  snap.variables = std::move(ms.variables);
  snap.slots = std::move(ms.slots);
  snap.state = std::move(ms.buffers);  // the model's buffers (running statistics)
  if (!p.feature_mean.empty()) {
    const auto n = static_cast<int64_t>(p.feature_mean.size());
    snap.state.push_back({"data/feature_mean", tensor::from<float>({n}, p.feature_mean)});
    snap.state.push_back({"data/feature_std", tensor::from<float>({n}, p.feature_std)});
  }
  auto path = checkpoint::save(p.checkpoint_dir, snap, p.config.checkpoint.keep);
  spdlog::info("checkpoint saved: {} (step {})", path, step);
  return path;
}

std::optional<std::string> write_checkpoint(coordinator_host& h, int64_t step, model_state& ms,
                                            nlohmann::json extra) {
  std::string path;
  try {
    path = save_job_checkpoint(h.plan(), step, ms, std::move(extra));
  } catch (const std::exception& e) {
    h.fail(std::string("writing checkpoint failed: ") + e.what());
    return std::nullopt;
  }
  h.write_metrics({{"type", "checkpoint"}, {"step", step}, {"path", path}});
  return path;
}

namespace {

// Where a resumed job starts. Strategies count steps differently (a
// parameter_server or elastic_average step is one worker's batch, a mirrored
// step a global batch), so a checkpoint of another kind of strategy resumes
// at the same position in the data: its epoch, and the same fraction of it.
int64_t start_step_for(const checkpoint::snapshot& snap, int64_t steps_per_epoch,
                       int64_t examples) {
  const auto& m = snap.meta;
  int64_t then_per_epoch = 0;
  try {
    auto then = parse_saved_job_config(m.config);
    auto strat = find_strategy(then.strategy.kind);
    if (!strat) return m.step;
    then_per_epoch = strat->updates_per_epoch(then, examples);
  } catch (const std::exception&) {
    return m.step;  // an older or foreign config: trust the step count
  }
  if (then_per_epoch == steps_per_epoch || then_per_epoch <= 0 || steps_per_epoch <= 0)
    return m.step;
  spdlog::info("the checkpoint counts {} steps per epoch, this job {}: resuming at epoch {}",
               then_per_epoch, steps_per_epoch, m.epoch);
  // Checked: an epoch no job reaches must be refused, not wrap to a step
  // before the checkpoint's (which would retrain and overwrite it).
  int64_t start = 0, into = 0;
  if (__builtin_mul_overflow(m.epoch, steps_per_epoch, &start) ||
      __builtin_mul_overflow(m.batch_in_epoch, steps_per_epoch, &into) ||
      __builtin_add_overflow(start, into / then_per_epoch, &start))
    throw job_error("--resume: checkpoint " + snap.dir + ": manifest field \"epoch\" is " +
                    std::to_string(m.epoch) + " but epoch " + std::to_string(m.epoch) + " of " +
                    std::to_string(steps_per_epoch) + " steps is beyond any step count");
  return start;
}

}  // namespace

void prepare_checkpoints(job_plan& plan) {
  const auto& o = plan.options;
  const fs::path marker = fs::path(plan.checkpoint_dir) / preemption::kMarkerFile;
  std::error_code ec;
  const bool after_preemption = !o.resume && !o.overwrite && fs::exists(marker, ec);
  if (after_preemption)
    spdlog::info("{} found: the last run was preempted; resuming from its checkpoint",
                 marker.string());
  if (!o.resume && !after_preemption) {
    if (auto old = checkpoint::resolve(plan.checkpoint_dir)) {
      if (!o.overwrite)
        throw job_error("checkpoint directory '" + plan.checkpoint_dir +
                        "' already holds checkpoints of an earlier run (latest: " + *old +
                        "); pass --resume to continue it, --overwrite to start over, or choose "
                        "another --output");
      spdlog::warn("--overwrite: removing earlier checkpoints in {}", plan.checkpoint_dir);
      fs::remove_all(plan.checkpoint_dir);
    }
    return;
  }
  auto dir = checkpoint::resolve(plan.checkpoint_dir);
  if (!dir) throw job_error("--resume: no checkpoint found in '" + plan.checkpoint_dir + "'");
  plan.resume_from = checkpoint::load(*dir);
  plan.start_step =
      plan.train ? start_step_for(*plan.resume_from, plan.steps_per_epoch, plan.train->size())
                 : plan.resume_from->meta.step;
  // Never "retrain from 0 and overwrite": a position this job cannot be at is
  // refused, naming the checkpoint.
  const auto& m = plan.resume_from->meta;
  if (plan.start_step < 0 || (plan.total_steps > 0 && plan.start_step > plan.total_steps))
    throw job_error("--resume: checkpoint " + *dir + ": manifest field \"step\" is " +
                    std::to_string(m.step) + " (epoch " + std::to_string(m.epoch) +
                    "), which resumes at step " + std::to_string(plan.start_step) +
                    ", outside this job's " + std::to_string(plan.total_steps) + " steps");
  spdlog::info("resuming from {} (step {}, saved under strategy {})", *dir, plan.start_step,
               plan.resume_from->meta.strategy);
}

void mark_preemption(const job_plan& plan, const nlohmann::json& summary) {
  const fs::path marker = fs::path(plan.checkpoint_dir) / preemption::kMarkerFile;
  std::error_code ec;
  if (!summary.contains("preempted")) {
    fs::remove(marker, ec);
    return;
  }
  nlohmann::json m{{"signal", summary["preempted"]},
                   {"step", summary.value("steps", int64_t{0})},
                   {"checkpoint", summary.value("checkpoint", std::string())}};
  fs::create_directories(marker.parent_path(), ec);
  try {
    monitoring::write_output_file(marker.string(), m.dump(2) + '\n');
  } catch (const monitoring::output_file_error& e) {
    spdlog::error("cannot write {}: a plain restart will not resume", e.what());
  }
}

}  // namespace troupe
