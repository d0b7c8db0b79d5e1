// The in-process device collective group of cpu:N and sim:N devices
// (collectives/host_group.hpp).
//
// Each rank numbers the collectives it issues 0, 1, 2, ...; the ranks of a
// group issue the same sequence. Per rank, two counters that only it writes:
//   posted   collectives issued: post s (buffer, kind, size, op) is in its
//            ring before posted passes s;
//   shared   of those, the ones whose share this rank has done, in order.
// A rank does its share of collective s once every rank has posted s; the
// shares of one collective are disjoint, and no buffer a share reads is
// written by another share of it:
//   all_reduce      the rank's segment of the elements, reduced across all
//                   buffers (rank order 0..n-1, bit-identical everywhere)
//                   and written to every buffer;
//   reduce_scatter  chunk `rank`, reduced into the rank's own buffer;
//   all_gather      the rank's own chunk copied into every peer's buffer.
// Collective s is done when every rank's shared has passed s: only then may
// the caller touch the buffer again (complete()). A rank does whatever
// shares are ready each time it issues one, without waiting, and waits only
// in complete(): for the posts its shares need, then for its peers' shares.
// A plain call is an issue and a complete().
//
// The last rank to issue a collective does its share at once, with its data
// hot; the others do theirs at their next issue or complete(). So a step
// that issues a collective per layer during backward and completes them
// before the update waits once, for what it truly depends on (its peers'
// gradients), instead of twice per collective.
//
// Every rank compares the posts of s with its own before its share; on a
// difference none of them touches a buffer, each counts its share as done
// (the group stays in step) and complete() throws the comparison.
// abort() stops shares from starting, waits for those under way (plain
// loops over buffers that may be freed once a rank's wait is released), and
// releases every wait with an error.
#include "collectives/host_group.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu_kernels.hpp"
#include "trace/trace.hpp"

namespace troupe {
namespace {

enum class coll_kind : uint8_t { all_reduce, reduce_scatter, all_gather };

const char* coll_name(coll_kind k) {
  switch (k) {
    case coll_kind::all_reduce:
      return "all_reduce";
    case coll_kind::reduce_scatter:
      return "reduce_scatter";
    case coll_kind::all_gather:
      break;
  }
  return "all_gather";
}

const char* kind_name(device_spec::kind_t k) {
  switch (k) {
    case device_spec::kind_t::cpu:
      return "cpu";
    case device_spec::kind_t::sim:
      return "sim";
    case device_spec::kind_t::cuda:
      break;
  }
  return "cuda";
}

// One rank's call: its buffer and what it asked for. `count` is n floats for
// all_reduce, the chunk for reduce_scatter and all_gather.
struct post {
  float* data = nullptr;
  std::size_t count = 0;
  coll_kind kind = coll_kind::all_reduce;
  reduce_op op = reduce_op::sum;
};

std::string describe(const post& p) {
  std::string s = coll_name(p.kind);
  if (p.kind != coll_kind::all_gather) s += std::string(" (") + reduce_op_name(p.op) + ")";
  if (p.kind == coll_kind::all_reduce)
    s += " of " + std::to_string(p.count) + " floats";
  else
    s += " in chunks of " + std::to_string(p.count) + " floats";
  return s;
}

bool same_call(const post& a, const post& b) {
  return a.kind == b.kind && a.count == b.count &&
         (a.kind == coll_kind::all_gather || a.op == b.op);
}

// dst[d][a, b) = (src[0] + src[1] + ... + src[m-1])[a, b) (* scale for
// mean), summed in rank order for every element by the dispatched vector
// loop (kernels::sum_sources, which reads every source block before it
// writes that block, so a destination may be a source), then copied to the
// other destinations.
void reduce_range(const std::vector<const float*>& src, const std::vector<float*>& dst,
                  std::size_t a, std::size_t b, reduce_op op, float scale) {
  if (b <= a) return;
  std::vector<const float*> from(src.size());
  for (std::size_t k = 0; k < src.size(); ++k) from[k] = src[k] + a;
  kernels::sum_sources(dst[0] + a, from.data(), from.size(), b - a,
                       op == reduce_op::mean ? scale : 1.0f);
  for (std::size_t d = 1; d < dst.size(); ++d)
    std::memcpy(dst[d] + a, dst[0] + a, (b - a) * sizeof(float));
}

// Collectives a rank may have issued beyond the oldest one not yet done
// everywhere (a step issues a few per variable, then completes them).
constexpr uint64_t window = 1024;

// What the other ranks read of one rank, on a cache line of its own.
struct alignas(64) rank_slot {
  std::atomic<uint64_t> posted{0}, shared{0};
  std::vector<post> ring = std::vector<post>(window);  // post s at s % window
};

class host_rendezvous final : public group_rendezvous,
                              public std::enable_shared_from_this<host_rendezvous> {
 public:
  host_rendezvous(int size, device_spec::kind_t kind)
      : n_(size),
        kind_(kind),
        slots_(static_cast<std::size_t>(size)),
        joined_(static_cast<std::size_t>(size), false) {}

  int size() const override { return n_; }
  std::unique_ptr<process_group> join(int rank, device_context& ctx) override;

  void abort(const std::string& why) override {
    {
      std::lock_guard lock(mtx_);
      if (!aborted_) {
        why_ = why;
        aborted_ = true;
      }
      cv_.notify_all();
    }
    await_no_share();
  }

  // Issues p as this rank's next collective; does the shares that are ready.
  void issue(int rank, const post& p, std::string& error);
  // Returns once every collective `rank` has issued is done on every rank;
  // throws the first mismatch met meanwhile (error) or the abort.
  void complete(int rank, std::string& error);

  void check(const char* what) {
    if (aborted_) throw aborted_error(what);
  }

 private:
  rank_slot& slot(int r) { return slots_[static_cast<std::size_t>(r)]; }
  // Whether every rank's `counter` (posted or shared) has passed s.
  bool everyone_past(std::atomic<uint64_t> rank_slot::*counter, uint64_t s) {
    for (auto& o : slots_)
      if ((o.*counter).load() <= s) return false;
    return true;
  }
  bool everyone_posted(uint64_t s) { return everyone_past(&rank_slot::posted, s); }
  bool everyone_shared(uint64_t s) { return everyone_past(&rank_slot::shared, s); }
  // Does `rank`'s next share if every rank has posted it; false if not.
  bool try_share(int rank, std::string& error);
  // Waits for `rank`'s shares up to s (doing them) and every peer's.
  void drive(int rank, uint64_t s, std::string& error);
  void share(int rank, uint64_t s, std::string& error);
  // Empty when every rank posted the same call as s; else which ranks differ
  // from rank 0, and how.
  std::string compare_posts(uint64_t s) const;

  device_error aborted_error(const char* what) {
    std::lock_guard lock(mtx_);
    return device_error(std::string(what) + ": the group was aborted: " + why_);
  }
  // After an abort: no share starts any more; those under way end soon.
  [[noreturn]] void fail_aborted(const char* what) {
    await_no_share();
    throw aborted_error(what);
  }
  void await_no_share() {
    while (in_share_.load() != 0) std::this_thread::yield();
  }
  // Wakes the ranks asleep in await() (if any) after a counter moved.
  void notify() {
    if (sleepers_.load() == 0) return;
    std::lock_guard lock(mtx_);
    cv_.notify_all();
  }

  // Waits until done() or the abort. The ranks are device threads on cores
  // of their own that reach a collective within microseconds of each other,
  // while a futex sleep and wake-up costs tens of microseconds (more on a
  // VM). So: spin a few microseconds; then yield the core for a while (a
  // peer that lost its core to another thread gets it back sooner); then
  // sleep. True when done() holds.
  template <class Done>
  bool await(Done done) {
    if (done()) return true;
    // Inside the step's device task the waits for the peers are the
    // collectives' cost as much as the shares: a trace (and troupe report's
    // all-reduce share) counts both as communication.
    trace::scoped_span waiting(trace::this_thread_track(), "collective_wait",
                               trace::category::communicate);
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto spin_until = start + std::chrono::microseconds(30);
    const auto yield_until = start + std::chrono::microseconds(300);
    for (unsigned i = 0;; ++i) {
      if (done()) return true;
      if (aborted_) return false;
      if (i % 32 != 0) {  // the clock is read now and then: it costs as much as a check
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        continue;
      }
      const auto now = clock::now();
      if (now >= yield_until) break;
      if (now >= spin_until) std::this_thread::yield();
    }
    std::unique_lock lock(mtx_);
    ++sleepers_;
    cv_.wait(lock, [&] { return aborted_ || done(); });
    --sleepers_;
    return done();
  }

  const int n_;
  const device_spec::kind_t kind_;
  std::vector<rank_slot> slots_;
  std::atomic<bool> aborted_{false};
  std::atomic<int> in_share_{0};  // shares under way
  std::atomic<int> sleepers_{0};  // ranks asleep on cv_
  std::mutex mtx_;
  std::condition_variable cv_;
  std::string why_;           // under mtx_
  std::vector<bool> joined_;  // under mtx_
};

class host_process_group final : public process_group {
 public:
  host_process_group(std::shared_ptr<host_rendezvous> g, int rank)
      : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  void all_reduce(float* data, std::size_t n, reduce_op op) override {
    issue_all_reduce(data, n, op);
    g_->complete(rank_, error_);
  }
  void reduce_scatter(float* data, std::size_t chunk, reduce_op op) override {
    issue_reduce_scatter(data, chunk, op);
    g_->complete(rank_, error_);
  }
  void all_gather(float* data, std::size_t chunk) override {
    issue_all_gather(data, chunk);
    g_->complete(rank_, error_);
  }
  work issue_all_reduce(float* data, std::size_t n, reduce_op op) override {
    require_device_reduce_op(op, "all_reduce");
    g_->issue(rank_, {data, n, coll_kind::all_reduce, op}, error_);
    return issued();
  }
  work issue_reduce_scatter(float* data, std::size_t chunk, reduce_op op) override {
    require_device_reduce_op(op, "reduce_scatter");
    g_->issue(rank_, {data, chunk, coll_kind::reduce_scatter, op}, error_);
    return issued();
  }
  work issue_all_gather(float* data, std::size_t chunk) override {
    g_->issue(rank_, {data, chunk, coll_kind::all_gather, reduce_op::sum}, error_);
    return issued();
  }
  void complete() override { g_->complete(rank_, error_); }
  void check() override { g_->check("device collectives"); }
  void abort(const std::string& why) override { g_->abort(why); }

 private:
  std::shared_ptr<host_rendezvous> g_;
  int rank_;
  std::string error_;  // the first mismatch since the last complete()
};

std::unique_ptr<process_group> host_rendezvous::join(int rank, device_context& ctx) {
  const std::string who = "device collectives: rank " + std::to_string(rank);
  if (rank < 0 || rank >= n_)
    throw device_error(who + " is outside the group of " + std::to_string(n_) + " ranks");
  if (ctx.spec().kind != kind_)
    throw device_error(who + " joined with " + ctx.spec().str() +
                       ", but this group's devices are " + kind_name(kind_) + ":N");
  std::lock_guard lock(mtx_);
  if (aborted_) throw device_error(who + " cannot join: the group was aborted: " + why_);
  if (joined_[static_cast<std::size_t>(rank)]) throw device_error(who + " joined twice");
  joined_[static_cast<std::size_t>(rank)] = true;
  return std::make_unique<host_process_group>(shared_from_this(), rank);
}

void host_rendezvous::issue(int rank, const post& p, std::string& error) {
  const char* what = coll_name(p.kind);
  if (aborted_) fail_aborted(what);
  auto& me = slot(rank);
  const uint64_t s = me.posted.load(std::memory_order_relaxed);
  // The ring slot is free once collective s - window is done everywhere.
  if (s >= window) drive(rank, s - window, error);
  me.ring[s % window] = p;
  me.posted.store(s + 1);
  notify();
  while (try_share(rank, error)) {
  }
}

void host_rendezvous::complete(int rank, std::string& error) {
  const uint64_t posted = slot(rank).posted.load(std::memory_order_relaxed);
  if (posted > 0) drive(rank, posted - 1, error);
  if (!error.empty()) {
    std::string e;
    e.swap(error);
    throw device_error(e);
  }
  check("device collectives");
}

bool host_rendezvous::try_share(int rank, std::string& error) {
  auto& me = slot(rank);
  const uint64_t s = me.shared.load(std::memory_order_relaxed);
  if (s >= me.posted.load(std::memory_order_relaxed) || !everyone_posted(s)) return false;
  share(rank, s, error);
  me.shared.store(s + 1);
  notify();
  return true;
}

void host_rendezvous::drive(int rank, uint64_t s, std::string& error) {
  auto& me = slot(rank);
  while (me.shared.load(std::memory_order_relaxed) <= s) {
    if (try_share(rank, error)) continue;
    const uint64_t next = me.shared.load(std::memory_order_relaxed);
    if (!await([&] { return everyone_posted(next); }))
      fail_aborted(coll_name(me.ring[next % window].kind));
  }
  if (!await([&] { return everyone_shared(s); })) fail_aborted(coll_name(me.ring[s % window].kind));
}

std::string host_rendezvous::compare_posts(uint64_t s) const {
  const auto at = static_cast<std::size_t>(s % window);
  const post& first = slots_[0].ring[at];
  bool same = true;
  for (int r = 1; r < n_ && same; ++r)
    same = same_call(first, slots_[static_cast<std::size_t>(r)].ring[at]);
  if (same) return {};
  std::string m = "the ranks' calls differ: rank 0 called " + describe(first);
  for (int r = 1; r < n_; ++r) {
    const post& p = slots_[static_cast<std::size_t>(r)].ring[at];
    if (!same_call(first, p)) m += ", rank " + std::to_string(r) + " called " + describe(p);
  }
  return m;
}

void host_rendezvous::share(int rank, uint64_t s, std::string& error) {
  const auto at = static_cast<std::size_t>(s % window);
  const auto r = static_cast<std::size_t>(rank);
  const auto n = static_cast<std::size_t>(n_);
  const post& me = slots_[r].ring[at];
  // Counted before the abort flag is read (both sequentially consistent):
  // either abort() sees this share under way and waits for it, or this
  // share sees the abort and does not start.
  ++in_share_;
  if (aborted_) {
    --in_share_;
    fail_aborted(coll_name(me.kind));
  }
  struct leave {
    std::atomic<int>& n;
    ~leave() { --n; }
  } left{in_share_};
  if (auto m = compare_posts(s); !m.empty()) {
    if (error.empty()) error = std::string(coll_name(me.kind)) + ": " + m;
    return;
  }
  trace::scoped_span span(trace::this_thread_track(), coll_name(me.kind),
                          trace::category::communicate);
  const float scale = 1.0f / static_cast<float>(n_);
  std::vector<const float*> src(n);
  std::vector<float*> dst(n);
  for (std::size_t k = 0; k < n; ++k) src[k] = dst[k] = slots_[k].ring[at].data;
  switch (me.kind) {
    case coll_kind::all_reduce: {
      // Segment `rank` of n, its bounds on 16-float (cache line) multiples
      // where the length allows, so no two ranks write one line.
      auto bound = [&](std::size_t i) {
        std::size_t x = me.count * i / n;
        if (i > 0 && i < n && me.count >= 16 * n) x = x / 16 * 16;
        return x;
      };
      reduce_range(src, dst, bound(r), bound(r + 1), me.op, scale);
      break;
    }
    case coll_kind::reduce_scatter:
      reduce_range(src, {me.data}, r * me.count, (r + 1) * me.count, me.op, scale);
      break;
    case coll_kind::all_gather:
      if (me.count == 0) break;
      for (std::size_t k = 0; k < n; ++k)
        if (k != r)
          std::memcpy(dst[k] + r * me.count, me.data + r * me.count, me.count * sizeof(float));
      break;
  }
}

}  // namespace

std::shared_ptr<group_rendezvous> make_host_rendezvous(int size, device_spec::kind_t kind) {
  if (size < 1)
    throw device_error("device collectives: a group needs at least 1 rank, not " +
                       std::to_string(size));
  if (kind == device_spec::kind_t::cuda)
    throw device_error(
        "device collectives: the host group serves cpu:N and sim:N devices, not cuda");
  return std::make_shared<host_rendezvous>(size, kind);
}

}  // namespace troupe
