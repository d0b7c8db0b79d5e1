#pragma once
// Design note "failure" (docs/design.md, section 8).
// What an actor that throws leaves behind. CAF's default exception handler
// writes the exception to stdout and ends the actor with a bare
// sec::runtime_error, which prints as "system_error(runtime_error)": the
// cause reached neither the log nor the job's error. Every troupe actor
// installs keep_exception_cause instead: the exception's what() is logged
// and becomes the exit reason (so down messages, the replies CAF bounces and
// the job's final error carry it).
#include <caf/all.hpp>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

// Logs "who: what()" at error level and returns it as the exit reason
// (caf::sec::runtime_error with that text, which describe() prints).
caf::error exception_exit_reason(const std::string& who, const std::exception_ptr& x);

// Installs the handler above on `self`; `who` names the actor in the text
// ("replica 2", "variable_shard 0").
template <class Self>
void keep_exception_cause(Self* self, std::string who) {
  self->set_exception_handler(
      [who = std::move(who)](std::exception_ptr& x) { return exception_exit_reason(who, x); });
}

// Why a replica's collective groups are aborted as it ends ("replica 2
// stopped"): a peer waiting in a collective fails with this in its error.
// The coordinator reads it back (replica_named_stopped) so that the job's
// failure names the replica that ended first, not a peer its abort failed
// in turn, whichever down message comes first.
std::string replica_stopped(int64_t index);
// The replica other than `self` that `cause` names as stopped, if any.
std::optional<int64_t> replica_named_stopped(const std::string& cause, int64_t self);

// Which replica's failure a job reports when several go down: a replica
// whose error names another as stopped (replica_named_stopped) whose down
// has not come yet is held back until that one's down, which is on its way
// (a replica aborts its groups as its state goes, before CAF sends its down
// message), and the first held failure stands for all such.
class failure_order {
 public:
  explicit failure_order(std::size_t replicas = 0) : down_(replicas, 0) {}
  // Replica i is down with `cause`; `failure` is the job's failure it would
  // be, or none where the job goes on without it. Returns what the job
  // reports now: that failure, or the one held for i; none while held.
  std::optional<std::string> replica_down(std::size_t i, const std::string& cause,
                                          std::optional<std::string> failure);

 private:
  std::vector<char> down_;
  std::string held_;
  int64_t held_for_ = -1;
};

}  // namespace troupe
