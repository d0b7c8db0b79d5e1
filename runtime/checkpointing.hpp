#pragma once
// Checkpoints of a running job: writing one from the state a strategy
// snapshots, and where a resumed job starts. The on-disk format is
// checkpoint/checkpoint.hpp's; what goes into the state is the strategy's
// (strategy::snapshot, strategy::restore).
#include <optional>
#include <string>

#include "actors/job_plan.hpp"
#include "actors/strategy_api.hpp"

namespace troupe {

// Saves the checkpoint of update `step` of plan's job (keeping
// checkpoint.keep of them), with `extra` in its manifest; returns its path.
// Throws checkpoint::checkpoint_error.
std::string save_job_checkpoint(const job_plan& p, int64_t step, model_state& ms,
                                nlohmann::json extra = {});

// Writes the checkpoint of update `step` (keeping checkpoint.keep of them)
// and its metrics line; returns its path. On failure the job fails through
// the host, naming the cause, and nothing is returned.
std::optional<std::string> write_checkpoint(coordinator_host& h, int64_t step, model_state& ms,
                                            nlohmann::json extra = nullptr);

// The owner's checkpoint directory before the first step: a fresh run
// refuses earlier checkpoints (or removes them with --overwrite); --resume
// loads the latest into plan.resume_from and sets plan.start_step. Throws
// job_error naming the directory.
// A fresh run whose checkpoint directory holds a preemption's marker
// (runtime/preemption.hpp) resumes as if --resume had been given.
void prepare_checkpoints(job_plan& plan);

// At the job's end, beside its checkpoints: a preempted job (summary field
// "preempted") leaves the marker naming its signal, step and checkpoint;
// any other end removes an earlier marker. Failures to write it are logged:
// the checkpoint itself is what a resume needs.
void mark_preemption(const job_plan& plan, const nlohmann::json& summary);

}  // namespace troupe
