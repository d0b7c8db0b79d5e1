#pragma once
// The coordinator's protocol (runtime/coordinator.hpp): one coordinator runs
// every job, whatever its strategy; the reports of a strategy's own roles
// (actor_learner's learners and rl_actors) reach its driver through it.
#include <caf/all.hpp>
#include <string>

#include "messages/protocols.hpp"
#include "messages/rl_messages.hpp"

namespace troupe {

using coordinator_actor = rl_reports_actor::extend<
    // Runs the job; answered with the summary (JSON text) when it ends.
    caf::replies_to<run_atom>::with<std::string>,
    // A restarted task's worker is back under its index (a replica, or a
    // strategy's own worker: an rl_actor). Untyped, as troupe node forwards
    // it without knowing the strategy; the driver knows what it is.
    caf::reacts_to<rejoin_atom, int64_t, caf::actor>,
    // The process is being preempted (SIGTERM, SIGUSR1; the string names
    // the signal): stop at the next update with a checkpoint, and say so in
    // the summary, so that the same command resumes.
    caf::reacts_to<preempt_atom, std::string>>;

}  // namespace troupe
