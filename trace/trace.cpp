#include "trace/trace.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "monitoring/output_file.hpp"

namespace troupe::trace {

namespace detail {
std::atomic<bool> on{false};
}

const char* category_name(category c) noexcept {
  switch (c) {
    case category::compute:
      return "compute";
    case category::communicate:
      return "communicate";
    case category::wait:
      return "wait";
    case category::io:
      return "io";
  }
  return "compute";
}

namespace {

using steady = std::chrono::steady_clock;

struct event {
  char ph = 'X';  // 'X' span, 'C' counter
  category cat = category::compute;
  const char* name = "";
  track_id tid = no_track;
  double ts = 0;
  double dur = 0;    // X
  double value = 0;  // C
  span_args args;
};

// One thread's events; its lock is taken by that thread, and once by finish().
struct buffer {
  std::mutex m;
  std::vector<event> events;
};

// What the current session shares between threads (slow paths only: a
// thread's first event, track registration, finish).
struct registry {
  std::mutex m;
  std::vector<std::shared_ptr<buffer>> buffers;
  std::map<std::string, track_id> tracks;
  std::vector<std::string> names;  // by track id
};

registry& reg() {
  static registry r;
  return r;
}

// Bumped by every session, so that a thread's buffer of an earlier session
// is replaced on its first event in the next.
std::atomic<uint64_t> generation{0};
std::atomic<int64_t> start_ns{0};
std::array<std::atomic<int64_t>, 1024> step_hints{};

struct thread_slot {
  uint64_t gen = 0;
  std::shared_ptr<buffer> buf;
  std::string own_name;
  uint64_t own_gen = 0;
  track_id own = no_track;
};
thread_local thread_slot this_thread;

buffer& my_buffer() {
  auto g = generation.load(std::memory_order_acquire);
  if (this_thread.gen != g || !this_thread.buf) {
    auto b = std::make_shared<buffer>();
    b->events.reserve(4096);
    std::lock_guard<std::mutex> lock(reg().m);
    reg().buffers.push_back(b);
    this_thread.buf = std::move(b);
    this_thread.gen = g;
  }
  return *this_thread.buf;
}

void record(const event& e) {
  auto& b = my_buffer();
  std::lock_guard<std::mutex> lock(b.m);
  b.events.push_back(e);
}

int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch())
      .count();
}

// Times are written in whole 1/1024 µs: such numbers are exact in a double
// and survive the decimal round trip, so a reader's ts + dur of a span equals
// the ts of the span that follows it, or its parent's end, exactly (a
// nesting check with no tolerance sees no false partial overlaps).
double quantize(double us) {
  return std::round(us * 1024.0) / 1024.0;
}

nlohmann::json span_json(const event& e, int64_t pid) {
  nlohmann::json j{{"ph", "X"},   {"name", e.name}, {"cat", category_name(e.cat)},
                   {"ts", e.ts},  {"dur", e.dur},   {"pid", pid},
                   {"tid", e.tid}};
  nlohmann::json args = nlohmann::json::object();
  if (e.args.step >= 0) args["step"] = e.args.step;
  if (e.args.bucket >= 0) args["bucket"] = e.args.bucket;
  if (e.args.bytes >= 0) args["bytes"] = e.args.bytes;
  if (!args.empty()) j["args"] = std::move(args);
  return j;
}

nlohmann::json metadata(const char* what, int64_t pid, track_id tid, nlohmann::json args) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

}  // namespace

double now_us() noexcept {
  return static_cast<double>(steady_ns() - start_ns.load(std::memory_order_relaxed)) / 1000.0;
}

track_id track(const std::string& name) {
  if (!enabled()) return no_track;
  auto& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  auto [it, fresh] = r.tracks.emplace(name, static_cast<track_id>(r.names.size()) + 1);
  if (fresh) r.names.push_back(name);
  return it->second;
}

void complete(track_id t, const char* name, category c, double begin_us, double end_us,
              span_args a) {
  if (!enabled() || t < 0) return;
  event e;
  e.ph = 'X';
  e.cat = c;
  e.name = name;
  e.tid = t;
  e.ts = quantize(begin_us);
  e.dur = std::max(0.0, quantize(end_us) - e.ts);
  e.args = a;
  record(e);
}

void counter(track_id t, const char* name, double value) {
  if (!enabled() || t < 0) return;
  event e;
  e.ph = 'C';
  e.name = name;
  e.tid = t;
  e.ts = quantize(now_us());
  e.value = value;
  record(e);
}

void name_this_thread(std::string track_name) {
  this_thread.own_name = std::move(track_name);
  this_thread.own_gen = 0;
}

track_id this_thread_track() {
  if (!enabled() || this_thread.own_name.empty()) return no_track;
  auto g = generation.load(std::memory_order_acquire);
  if (this_thread.own_gen != g) {
    this_thread.own = track(this_thread.own_name);
    this_thread.own_gen = g;
  }
  return this_thread.own;
}

void note_step(int64_t rank, int64_t step) noexcept {
  if (rank >= 0 && static_cast<std::size_t>(rank) < step_hints.size())
    step_hints[static_cast<std::size_t>(rank)].store(step, std::memory_order_relaxed);
}

int64_t step_of(int64_t rank) noexcept {
  if (rank < 0 || static_cast<std::size_t>(rank) >= step_hints.size()) return -1;
  return step_hints[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed);
}

struct session::impl {
  job_info info;
  // Opened at the start (a path that cannot be written fails the job before
  // it trains), never through a link planted at its name.
  monitoring::output_file file;
  bool finished = false;
};

session::session(std::string path, job_info info) : path_(std::move(path)) {
  if (enabled())
    throw trace_error("cannot trace to '" + path_ +
                      "': another traced job is running in this process");
  impl_ = std::make_unique<impl>();
  impl_->info = std::move(info);
  try {
    impl_->file = monitoring::output_file(path_, monitoring::output_file::mode::replace);
  } catch (const monitoring::output_file_error& e) {
    std::string why = e.what();  // "<path>: <why>"
    if (why.rfind(path_ + ": ", 0) == 0) why.erase(0, path_.size() + 2);
    throw trace_error("cannot write trace file '" + path_ + "': " + why);
  }
  {
    std::lock_guard<std::mutex> lock(reg().m);
    reg().buffers.clear();
    reg().tracks.clear();
    reg().names.clear();
  }
  for (auto& h : step_hints) h.store(-1, std::memory_order_relaxed);
  start_ns.store(steady_ns(), std::memory_order_relaxed);
  generation.fetch_add(1, std::memory_order_acq_rel);
  detail::on.store(true, std::memory_order_release);
}

session::~session() {
  try {
    finish();
  } catch (...) {
    // A destructor must not throw; the job's own error (if any) is the one
    // its caller reports.
  }
}

void session::finish() {
  if (!impl_ || impl_->finished) return;
  impl_->finished = true;
  const double end_us = quantize(now_us());
  detail::on.store(false, std::memory_order_release);

  std::vector<event> events;
  std::vector<std::string> names;
  {
    auto& r = reg();
    std::lock_guard<std::mutex> lock(r.m);
    for (auto& b : r.buffers) {
      std::lock_guard<std::mutex> bl(b->m);
      events.insert(events.end(), b->events.begin(), b->events.end());
      b->events.clear();
    }
    r.buffers.clear();
    names = r.names;
  }

  const auto pid = static_cast<int64_t>(::getpid());
  std::ostringstream out;
  out << "{\"traceEvents\":[\n";
  out << metadata("process_name", pid, 0, {{"name", "troupe " + impl_->info.job}}).dump();
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto tid = static_cast<track_id>(i) + 1;
    out << ",\n" << metadata("thread_name", pid, tid, {{"name", names[i]}}).dump();
    out << ",\n" << metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}).dump();
  }
  for (const auto& e : events) {
    if (e.ph == 'X') {
      out << ",\n" << span_json(e, pid).dump();
    } else {
      if (e.tid < 1 || static_cast<std::size_t>(e.tid) > names.size()) continue;
      const auto& series = names[static_cast<std::size_t>(e.tid) - 1];
      out << ",\n"
          << nlohmann::json{{"ph", "C"},    {"name", e.name}, {"pid", pid},
                            {"tid", e.tid}, {"ts", e.ts},     {"args", {{series, e.value}}}}
                 .dump();
    }
  }
  nlohmann::json other{{"troupe_version", TROUPE_VERSION},
                       {"job", impl_->info.job},
                       {"strategy", impl_->info.strategy},
                       {"replicas", impl_->info.replicas},
                       {"start_us", 0.0},
                       {"end_us", end_us}};
  out << "\n],\"displayTimeUnit\":\"ms\",\"otherData\":" << other.dump() << "}\n";
  if (!impl_->file.write(out.str())) throw trace_error("writing trace file '" + path_ + "' failed");
  impl_->file = monitoring::output_file();
}

}  // namespace troupe::trace
