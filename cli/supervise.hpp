#pragma once
// supervise(): the local child processes of `troupe launch` (cli/launch.hpp),
// as torchrun/mpirun keep them.
//
// - Each line a child writes is relayed with its task name in front
//   ("[worker:1] ..."), stdout to stdout and stderr to stderr, one write per
//   line so lines of different tasks never interleave.
// - SIGINT/SIGTERM/SIGUSR1 to the launcher are forwarded to every child,
//   which stops as runtime/stop_policy.hpp says (with a checkpoint when
//   training); a second SIGINT/SIGTERM is forwarded too (every child stops
//   at once), a third kills them. Their output is relayed to the end, and
//   the launcher's exit status is theirs (see supervise).
// - When a child exits non-zero or is killed, the others get SIGTERM, then
//   SIGKILL after a grace period; the launcher exits 1 naming the task, its
//   pid and its status. It exits 0 when every child exits 0.
// - Unless the child is `survivable` (a worker task under a strategy that
//   goes on without it): then its end is reported and the others go on; it
//   is started again while restarts are left (restart_workers, in total).
// - With a `chief` child, the chief's end ends the job and the launcher's
//   exit status is the chief's.
// - No orphans: each child leads its own process group, which is SIGKILLed
//   once the child is gone (so its own children go too), and a child gets
//   SIGKILL when the launcher dies (PR_SET_PDEATHSIG).
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::launch {

// One child process.
struct child {
  std::string name;               // the output prefix and the name in messages
  std::vector<std::string> argv;  // argv[0]: a path (no PATH lookup)
  std::vector<std::string> env;   // "NAME=value" added to the launcher's environment
  // The job's chief: when it ends, the job ends (the others get
  // supervise_options::after_chief_seconds to end on their own), and its
  // exit status is the launcher's.
  bool chief = false;
  // The job goes on without this task when it dies (a worker task under
  // parameter_server, elastic_average, actor_learner): reported, restarted
  // while restarts are left, never the reason to stop the others.
  bool survivable = false;
  // Why the job cannot go on when this task dies, added to the message
  // (e.g. "the mirrored strategy cannot go on without a worker task").
  std::string why_fatal;
};

struct supervise_options {
  double grace_seconds = 3;  // between SIGTERM and SIGKILL when stopping
  // Between a signal forwarded to the tasks and SIGKILL: a task that is
  // training leaves with its checkpoint within its cluster.grace_seconds.
  double signal_grace_seconds = 30;
  int out_fd = 1;  // where the children's prefixed stdout goes
  int err_fd = 2;  // their stderr, and the launcher's own messages
  // Restarts of survivable tasks that died, in all (not per task).
  int restart_workers = 0;
  // Once the chief has exited 0, how long the others may take to end on
  // their own (they follow the chief) before they get SIGTERM.
  double after_chief_seconds = 15;
  // Log `task NAME started (pid N)` for every start (troupe launch does).
  bool log_starts = false;
  // When set, every start of a child (restarts included) gets a socket of
  // its own for its enrolment with the job CA (net/launch_enrol.hpp):
  // its number in TROUPE_ENROL_FD, no other child inherits it. The first
  // message the child sends there is answered with enrol(child, message,
  // refusal), then the socket is closed: one answer per start. A non-empty
  // refusal is logged.
  std::function<std::string(const child&, std::string_view request, std::string& refusal)> enrol;
};

// Starts the children, relays their output and waits for all of them.
// Without a `chief` child: returns 0 when every child exits 0, else 1 (after
// stopping the others and writing `troupe launch: task NAME (pid P) exited
// with status N` or `... killed by signal N (SIGNAME)` to err_fd). With a
// chief: the chief's exit status when it ended on its own (1 when a signal
// ended it), 1 when the launcher stopped the job because a task that is not
// survivable ended. After a signal to the launcher: the chief's status, or
// without a chief the first child's that is not 0 (a child ended by a
// signal counts as 128 + the signal, as in a shell). Survivable children:
// see `child`. Installs handlers for SIGINT, SIGTERM, SIGUSR1 and SIGCHLD
// while it runs and restores the previous ones. Call from one thread.
int supervise(const std::vector<child>& children, const supervise_options& opts = {});

}  // namespace troupe::launch
