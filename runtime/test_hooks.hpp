#pragma once
// Test interface of troupe's processes. Tests run `troupe run` and `troupe
// node` as processes, so they name faults in the environment; this is the
// one place that reads them, into fault_injection (docs/testing.md, "Test
// hooks"). Each variable that is set is logged at warning (TROUPE_TEST_HOLD
// when it strikes), so that a stray one in a user's environment shows:
//   TROUPE_TEST_FAIL_REPLICA="K:S": replica K, when this process hosts it,
//     throws in its compute at step S (fault_injection::fail_replica);
//   TROUPE_TEST_HOLD_SHARD_AT_EXIT (any value): a shard handle outlives the
//     job (fault_injection::hold_shard_at_exit);
//   TROUPE_TEST_GATE_FAILS_AFTER_S=S: the gate's thread fails S seconds
//     after it starts (fault_injection::gate_fails_after_seconds);
//   TROUPE_TEST_HOLD="POINT:SECONDS": the process holds SECONDS at POINT
//     (fault_injection::hold; runtime/stop_policy.hpp, hold_for_test).
#include <memory>

#include "actors/fault_injection.hpp"

namespace troupe {

// `given` with the environment's faults added (`given` itself, null
// included, when the environment names none).
std::shared_ptr<const fault_injection> faults_from_environment(
    const std::shared_ptr<const fault_injection>& given);

// Makes `faults`' hold (if any) the one stop_policy::hold_for_test applies
// in this process. Called once, before the job's threads start.
void install_process_faults(const fault_injection& faults);

}  // namespace troupe
