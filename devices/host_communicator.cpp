// The in-process device collective group of cpu:N and sim:N devices
// (devices/host_communicator.hpp).
//
// A collective is two generation barriers under one mutex:
//   B1  every rank posts its buffer and waits for the others; the last to
//       arrive compares the posts (a different collective, op or size fails
//       it on every rank) and opens the barrier;
//   --  each rank, without the lock, does its share: all_reduce reduces the
//       rank's segment of the elements across all buffers and writes it to
//       every buffer; reduce_scatter reduces chunk `rank` into its own
//       buffer; all_gather copies its chunk into every peer's buffer. The
//       shares are disjoint, and no buffer a share reads is written by
//       another share;
//   B2  every rank waits until all shares are done, so no rank returns (and
//       lets its caller touch its buffer) while a peer still reads or writes
//       it.
// The posts stay valid from B1 to B2: a rank posts again only after B2,
// which needs every rank. abort() releases ranks waiting in B1 (a peer that
// never comes); B2 is not abortable: every rank has posted, so the shares
// are plain loops that finish, and a rank released early could free a
// buffer a peer is still writing.
#include "devices/host_communicator.hpp"

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

class host_group final : public device_collective_group,
                         public std::enable_shared_from_this<host_group> {
 public:
  host_group(int size, device_spec::kind_t kind)
      : n_(size),
        kind_(kind),
        posts_(static_cast<std::size_t>(size)),
        joined_(static_cast<std::size_t>(size), false) {}

  int size() const override { return n_; }
  std::unique_ptr<device_communicator> join(int rank, device_context& ctx) override;

  void abort(const std::string& why) override {
    std::lock_guard lock(mtx_);
    if (!aborted_) {
      aborted_ = true;
      why_ = why;
    }
    cv_.notify_all();
  }

  void run(int rank, const post& p);

  void check(const char* what) {
    std::lock_guard lock(mtx_);
    if (aborted_) throw aborted_error(what);
  }

 private:
  // Call with mtx_ held.
  device_error aborted_error(const char* what) const {
    return device_error(std::string(what) + ": the group was aborted: " + why_);
  }
  // Empty when every rank made the same call; else which ranks differ from
  // rank 0, and how. Call with mtx_ held, all ranks posted.
  std::string compare_posts() const {
    bool same = true;
    for (int r = 1; r < n_ && same; ++r) same = same_call(posts_[0], posts_[r]);
    if (same) return {};
    std::string s = "the ranks' calls differ: rank 0 called " + describe(posts_[0]);
    for (int r = 1; r < n_; ++r)
      if (!same_call(posts_[0], posts_[r]))
        s += ", rank " + std::to_string(r) + " called " + describe(posts_[r]);
    return s;
  }
  void share(int rank);

  const int n_;
  const device_spec::kind_t kind_;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::atomic<bool> aborted_{false};
  std::string why_;
  std::vector<post> posts_;   // written in B1 under mtx_, read by the shares
  std::vector<bool> joined_;  // under mtx_
  int arrived_ = 0, finished_ = 0;
  // Completed B1s and B2s. Written under mtx_; read without it while a rank
  // spins (await).
  std::atomic<uint64_t> gen_arrive_{0}, gen_finish_{0};

  // Waits until done() holds, with mtx_ held on entry and on return. The
  // ranks are device threads on cores of their own that reach a collective
  // within microseconds of each other, while a futex sleep and wake-up costs
  // tens of microseconds (more on a VM), several times per step when a
  // step's gradients are reduced layer by layer. So: spin a few
  // microseconds; then yield the core for a while (a peer that lost its
  // core to another thread gets it back sooner); then sleep.
  template <class Done>
  void await(std::unique_lock<std::mutex>& lock, Done done) {
    lock.unlock();
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto spin_until = start + std::chrono::microseconds(30);
    const auto yield_until = start + std::chrono::microseconds(300);
    for (auto now = start; !done() && now < yield_until; now = clock::now()) {
      if (now < spin_until) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
    lock.lock();
    cv_.wait(lock, done);
  }
  std::string mismatch_;  // the latest B1's comparison; read before the next B1 opens
};

class host_communicator final : public device_communicator {
 public:
  host_communicator(std::shared_ptr<host_group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  void all_reduce(float* data, std::size_t n, reduce_op op) override {
    require_device_reduce_op(op, "all_reduce");
    g_->run(rank_, {data, n, coll_kind::all_reduce, op});
  }
  void reduce_scatter(float* data, std::size_t chunk, reduce_op op) override {
    require_device_reduce_op(op, "reduce_scatter");
    g_->run(rank_, {data, chunk, coll_kind::reduce_scatter, op});
  }
  void all_gather(float* data, std::size_t chunk) override {
    g_->run(rank_, {data, chunk, coll_kind::all_gather, reduce_op::sum});
  }
  void check() override { g_->check("device collectives"); }
  void abort(const std::string& why) override { g_->abort(why); }

 private:
  std::shared_ptr<host_group> g_;
  int rank_;
};

std::unique_ptr<device_communicator> host_group::join(int rank, device_context& ctx) {
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
  return std::make_unique<host_communicator>(shared_from_this(), rank);
}

void host_group::run(int rank, const post& p) {
  const char* what = coll_name(p.kind);
  {
    std::unique_lock lock(mtx_);
    if (aborted_) throw aborted_error(what);
    posts_[static_cast<std::size_t>(rank)] = p;
    const uint64_t g = gen_arrive_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_arrive_;
      mismatch_ = compare_posts();
      cv_.notify_all();
    } else {
      await(lock, [&] { return gen_arrive_ != g || aborted_; });
      if (gen_arrive_ == g) {  // aborted before every rank came
        --arrived_;
        throw aborted_error(what);
      }
    }
    // Every rank reads the same comparison and fails alike; the group stays
    // in step for the next collective.
    if (!mismatch_.empty()) throw device_error(std::string(what) + ": " + mismatch_);
  }
  share(rank);
  std::unique_lock lock(mtx_);
  const uint64_t g = gen_finish_;
  if (++finished_ == n_) {
    finished_ = 0;
    ++gen_finish_;
    cv_.notify_all();
  } else {
    await(lock, [&] { return gen_finish_ != g; });
  }
}

void host_group::share(int rank) {
  const auto r = static_cast<std::size_t>(rank);
  const auto n = static_cast<std::size_t>(n_);
  const post& me = posts_[r];
  const float scale = 1.0f / static_cast<float>(n_);
  std::vector<const float*> src(n);
  for (std::size_t k = 0; k < n; ++k) src[k] = posts_[k].data;
  switch (me.kind) {
    case coll_kind::all_reduce: {
      // Segment `rank` of n, its bounds on 16-float (cache line) multiples
      // where the length allows, so no two ranks write one line.
      auto bound = [&](std::size_t i) {
        std::size_t x = me.count * i / n;
        if (i > 0 && i < n && me.count >= 16 * n) x = x / 16 * 16;
        return x;
      };
      std::vector<float*> dst(n);
      for (std::size_t k = 0; k < n; ++k) dst[k] = posts_[k].data;
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
          std::memcpy(posts_[k].data + r * me.count, me.data + r * me.count,
                      me.count * sizeof(float));
      break;
  }
}

}  // namespace

std::shared_ptr<device_collective_group> make_host_collective_group(int size,
                                                                    device_spec::kind_t kind) {
  if (size < 1)
    throw device_error("device collectives: a group needs at least 1 rank, not " +
                       std::to_string(size));
  if (kind == device_spec::kind_t::cuda)
    throw device_error(
        "device collectives: the host group serves cpu:N and sim:N devices, not cuda");
  return std::make_shared<host_group>(size, kind);
}

}  // namespace troupe
