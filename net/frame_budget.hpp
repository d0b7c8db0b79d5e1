#pragma once
// The process's budget for bytes of BASP frames that have not fully arrived.
//
// Why: CAF 0.17's BASP broker sizes its read buffer from a frame's header
// and zero-fills it before the payload arrives, so a holder of the secret
// who announced frames just under the cap and never finished them made a
// chief allocate the cap per link (187 -> 705 MB, then std::bad_alloc). The
// guard (net/basp_guard.hpp) now holds a frame until its last byte
// arrived, in memory that grows with the bytes received, and only then hands
// it to BASP. What it holds is counted here, per link and for the process:
//
//   - a link holds at most one unfinished frame (at most the job's cap);
//   - the process holds at most `limit` bytes (link_security::
//     max_unfinished_bytes) in unfinished frames across all links. A link
//     whose next bytes do not fit waits (its peer's TCP window fills up),
//     and the unfinished frame that arrives slowest (bytes held per second
//     since its first byte), among those older than kMinAge, is cut: its
//     link closes, with a warning naming the peer. A frame that arrives at
//     network speed finishes long before it is old enough to be cut; one
//     that trickles or stalls is the first to go.
//
// Besides: BASP hears nothing on a link while its frame is unfinished, so
// its own connection timeout (no message, heartbeats included, for about
// three heartbeats) also ends a link whose frame stays unfinished, as it
// did when a frame's header reached it first.
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>

namespace troupe {

class frame_budget {
 public:
  using clock_type = std::chrono::steady_clock;
  // How long a frame is unfinished before it may be cut for another's bytes.
  static constexpr std::chrono::milliseconds kMinAge{1000};

  // One link's part: registered while the link's inbound side runs. `cut` is
  // called (under the budget's lock: it must not block) with why, when the
  // budget closes this link for another's bytes.
  class share {
   public:
    share(frame_budget& budget, std::string peer, std::function<void(const std::string&)> cut);
    ~share();
    share(const share&) = delete;
    share& operator=(const share&) = delete;

   private:
    friend class frame_budget;
    frame_budget& budget_;
    std::string peer_;
    std::function<void(const std::string&)> cut_;
    uint64_t held_ = 0;             // counted against the budget
    clock_type::time_point since_;  // the unfinished frame's first byte
    std::string cut_reason_;        // non-empty once cut
  };

  // The process's budget.
  static frame_budget& process();

  // Room for `more` bytes of `s`'s frame within `limit`, waiting (and cutting
  // the slowest old frame) while there is none. "" once granted, else why `s`
  // cannot have it: it was cut, or `keep_waiting` said stop.
  std::string reserve(share& s, uint64_t more, uint64_t limit,
                      const std::function<bool()>& keep_waiting);
  // `s` now holds `held` bytes of an unfinished frame (0: none).
  void settle(share& s, uint64_t held);
  uint64_t used() const;
  uint64_t cuts() const;

 private:
  enum class outcome { granted, wait, cut };
  // Under the lock: whether `more` bytes of `s` fit now (after cutting the
  // slowest old frame, which may be `s`'s own).
  outcome try_reserve(share& s, uint64_t more, uint64_t limit);
  share* slowest_old_frame(clock_type::time_point now) const;
  void cut(share& victim, uint64_t limit, clock_type::time_point now);

  mutable std::mutex mutex_;
  std::list<share*> shares_;
  uint64_t used_ = 0;
  uint64_t cuts_ = 0;
};

}  // namespace troupe
