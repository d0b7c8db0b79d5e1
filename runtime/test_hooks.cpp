#include "runtime/test_hooks.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/stop_policy.hpp"

namespace troupe {

namespace {

void read_fail_replica(const char* v, fault_injection& faults) {
  long long k = -1, step = -1;
  if (std::sscanf(v, "%lld:%lld", &k, &step) != 2) {
    spdlog::warn("test hook TROUPE_TEST_FAIL_REPLICA={}: not \"K:S\", ignored", v);
    return;
  }
  faults.fail_replica = {k, step};
  spdlog::warn("test hook TROUPE_TEST_FAIL_REPLICA={}: replica {} fails at step {}", v, k, step);
}

void read_hold(const char* v, fault_injection& faults) {
  const char* colon = std::strchr(v, ':');
  if (!colon || colon == v) {
    spdlog::warn("test hook TROUPE_TEST_HOLD={}: not \"POINT:SECONDS\", ignored", v);
    return;
  }
  faults.hold = {std::string(v, colon), std::max(0.0, std::atof(colon + 1))};
  // At info: the hold itself warns when it strikes, and the signal tests
  // take a task's first warning for that moment.
  spdlog::info("test hook TROUPE_TEST_HOLD={}: the process holds {:g} s at {}", v,
               faults.hold.seconds, faults.hold.point);
}

}  // namespace

std::shared_ptr<const fault_injection> faults_from_environment(
    const std::shared_ptr<const fault_injection>& given) {
  const char* fail_replica = std::getenv("TROUPE_TEST_FAIL_REPLICA");
  const bool hold_shard = std::getenv("TROUPE_TEST_HOLD_SHARD_AT_EXIT") != nullptr;
  const char* gate_fails_after = std::getenv("TROUPE_TEST_GATE_FAILS_AFTER_S");
  const char* hold = std::getenv("TROUPE_TEST_HOLD");
  if (!fail_replica && !hold_shard && !gate_fails_after && !hold) return given;
  auto faults = faults_or_none(given);
  if (fail_replica) read_fail_replica(fail_replica, faults);
  if (hold_shard)
    spdlog::warn("test hook TROUPE_TEST_HOLD_SHARD_AT_EXIT: a shard handle outlives the job");
  faults.hold_shard_at_exit = faults.hold_shard_at_exit || hold_shard;
  if (gate_fails_after) {
    faults.gate_fails_after_seconds = std::max(0.0, std::atof(gate_fails_after));
    spdlog::warn("test hook TROUPE_TEST_GATE_FAILS_AFTER_S={}: this gate fails after {} s",
                 gate_fails_after, faults.gate_fails_after_seconds);
  }
  if (hold) read_hold(hold, faults);
  return inject_faults(faults);
}

void install_process_faults(const fault_injection& faults) {
  stop_policy::hold_for_test_at(faults.hold.point, faults.hold.seconds);
}

}  // namespace troupe
