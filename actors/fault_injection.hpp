#pragma once
// Test interface: faults a test injects into a job to check how the runtime
// takes them (a replica that throws, a shard that dies, a worker that joins
// late, a node whose actor system cannot stop or whose gate fails).
// Production jobs carry none: job_options::faults is null there, and each
// role reads it in one place (topology's replica configs, actor_learner's
// actors and learners, the ssp driver, the coordinator's shard check,
// troupe node's gate and shutdown).
//
// troupe run and troupe node take their faults from the environment as
// well (faults_from_environment, runtime/test_hooks.hpp; docs/testing.md,
// "Test hooks"), since their tests run them as separate processes: every
// hook they read sets a field here.
#include <cstdint>
#include <memory>
#include <string>

namespace troupe {

struct fault_injection {
  // One instance of a role (by index) and the count at which its fault
  // strikes; both >= 0 to enable.
  struct target {
    int64_t index = -1;
    int64_t at = -1;
    // `at` for instance k, -1 when k is not the target.
    int64_t at_for(int64_t k) const { return index >= 0 && index == k ? at : -1; }
  };
  // Replica `index` throws in its compute at step `at` (actor_learner:
  // rl_actor `index` fails after `at` unrolls).
  target fail_replica;
  // actor_learner: learner `index` fails at update `at`.
  target fail_learner;
  // parameter_server, elastic_average: worker `index` takes no step until
  // `at` updates are done, then joins as a late worker would.
  target join_late;
  // central_storage, parameter_server: variable shard `index` fails once
  // `at` updates are done.
  target fail_shard;
  // troupe node: a handle to one of this task's shards is held past the end
  // of the job, as CAF's stranded messages can hold one, so that the bounded
  // shutdown (end_node_system) is exercised. The holder releases it once the
  // bounded wait is over.
  bool hold_shard_at_exit = false;
  // troupe node: its gate's thread fails this many seconds after it starts
  // (>= 0 to enable), so that a gate that stops mid-job is exercised.
  double gate_fails_after_seconds = -1;
  // troupe run, troupe node: the process holds `seconds` when it reaches
  // `point` (a phase such as "loading" or "writing", or "checkpoint": every
  // checkpoint write), logging it at warning, so that a signal test can
  // signal it there (empty point: no hold).
  struct hold_point {
    std::string point;
    double seconds = 0;
  } hold;

  // Setters for a test's one-liner:
  // `inject_faults(fault_injection{}.fail_replica_at(0, 27))`.
  fault_injection& fail_replica_at(int64_t k, int64_t step) { return set(fail_replica, k, step); }
  fault_injection& fail_learner_at(int64_t k, int64_t update) {
    return set(fail_learner, k, update);
  }
  fault_injection& join_late_at(int64_t k, int64_t updates) { return set(join_late, k, updates); }
  fault_injection& fail_shard_at(int64_t k, int64_t updates) { return set(fail_shard, k, updates); }

 private:
  fault_injection& set(target& t, int64_t k, int64_t at) {
    t = {k, at};
    return *this;
  }
};

// A job's faults for tests to put in job_options::faults.
inline std::shared_ptr<const fault_injection> inject_faults(fault_injection f) {
  return std::make_shared<const fault_injection>(f);
}

// The faults to apply: none when the job has no test interface (null).
inline const fault_injection& faults_or_none(const std::shared_ptr<const fault_injection>& f) {
  static const fault_injection none;
  return f ? *f : none;
}

}  // namespace troupe
