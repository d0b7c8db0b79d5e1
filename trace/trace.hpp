#pragma once
// Timeline traces (troupe run --trace FILE): what every actor and device
// thread did when, as Chrome trace-event JSON (Perfetto, chrome://tracing).
//
// Off by default: every recording function starts with enabled(), one
// relaxed load of a flag that is false for the whole of an untraced job (a
// branch the CPU predicts). When on, events go to a buffer of the recording
// thread; its lock is taken by that thread only, except once at the end when
// the session collects it, so it is never contended on the hot path.
//
// One session at a time per process (a job's), from its start to its end;
// events are written when it finishes, also when the job fails.
//
// The format (docs/traces.md): tracks are `tid`s named by
// thread_name metadata; spans are complete ("X") events whose `cat` is one
// of compute, communicate, wait, io; spans on one track nest but never
// partially overlap; counters ("C") carry mailbox and queue depths.
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace troupe::trace {

enum class category : uint8_t { compute, communicate, wait, io };
const char* category_name(category c) noexcept;

// A track's id (the event's tid); no_track when tracing is off.
using track_id = int64_t;
inline constexpr track_id no_track = -1;

namespace detail {
extern std::atomic<bool> on;
}
inline bool enabled() noexcept {
  return detail::on.load(std::memory_order_relaxed);
}

// Microseconds since the session started (steady clock).
double now_us() noexcept;

// The track named `name` ("replica:0", "device:1") in the current session,
// registered on first use; no_track when tracing is off. Not for the hot
// path: an actor looks its track up once, when it starts.
track_id track(const std::string& name);

// Optional arguments of a span (shown in the viewer; -1: absent).
struct span_args {
  int64_t step = -1;
  int64_t bucket = -1;
  int64_t bytes = -1;
};

// A span [begin_us, end_us] on track t. `name` must outlive the session (a
// string literal).
void complete(track_id t, const char* name, category c, double begin_us, double end_us,
              span_args a = {});
// A counter sample: the series is named after the track (mailbox_depth of
// "replica:0" is the series "replica:0" of the counter "mailbox_depth").
void counter(track_id t, const char* name, double value);

// A thread that does work for several actors (a device thread) names its own
// track once; work it runs records there.
void name_this_thread(std::string track_name);
track_id this_thread_track();

// Synchronous work on the calling thread, from construction to destruction.
class scoped_span {
 public:
  scoped_span(track_id t, const char* name, category c, span_args a = {}) noexcept
      : t_(enabled() ? t : no_track), name_(name), c_(c), a_(a), begin_(t_ >= 0 ? now_us() : 0) {}
  ~scoped_span() {
    if (t_ >= 0) complete(t_, name_, c_, begin_, now_us(), a_);
  }
  scoped_span(const scoped_span&) = delete;
  scoped_span& operator=(const scoped_span&) = delete;

 private:
  track_id t_;
  const char* name_;
  category c_;
  span_args a_;
  double begin_;
};

// An actor's track as a sequence of states (what it computes or waits for):
// set() ends the current state's span and begins the next, so the spans
// follow each other without gap or overlap from the first set() to close().
// Setting the state it is already in does nothing. Used by one actor only.
class state_track {
 public:
  state_track() = default;
  explicit state_track(const std::string& name) : t_(track(name)) {}
  ~state_track() { close(); }
  state_track(const state_track&) = delete;
  state_track& operator=(const state_track&) = delete;

  // Names the track (when tracing is on).
  void open(const std::string& name) { t_ = track(name); }
  track_id id() const noexcept { return t_; }
  void set(const char* name, category c, int64_t step = -1) {
    if (t_ < 0 || !enabled()) return;
    if (name_ == name && c_ == c && step_ == step) return;
    double now = now_us();
    if (name_) complete(t_, name_, c_, begin_, now, {step_, -1, -1});
    name_ = name;
    c_ = c;
    step_ = step;
    begin_ = now;
  }
  void close() {
    if (name_ && enabled()) complete(t_, name_, c_, begin_, now_us(), {step_, -1, -1});
    name_ = nullptr;
  }

 private:
  track_id t_ = no_track;
  const char* name_ = nullptr;
  category c_ = category::wait;
  int64_t step_ = -1;
  double begin_ = 0;
};

// The collective messages carry no step number: replica k notes the step
// whose collective it asks its reducer (rank k) for, and the reducer labels
// its spans with it. Ranks beyond the table read -1.
void note_step(int64_t rank, int64_t step) noexcept;
int64_t step_of(int64_t rank) noexcept;

class trace_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct job_info {
  std::string job;
  std::string strategy;
  int64_t replicas = 0;
};

// One traced job. The constructor opens `path` (truncating it) and turns
// tracing on; it throws trace_error naming the path when the file cannot be
// written, before anything runs. finish() turns tracing off and writes the
// events; the destructor does it if the job did not (a failing job's trace
// is written too).
class session {
 public:
  session(std::string path, job_info info);
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  // Marks the job's end (end_us), collects every thread's events and writes
  // the file; later calls do nothing. Throws trace_error on a write error.
  void finish();
  const std::string& path() const noexcept { return path_; }

 private:
  struct impl;
  std::string path_;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::trace
