// NCCL device collective groups (collectives/process_group.hpp,
// collectives/nccl_id.hpp); built with the CUDA path when NCCL is found
// (TROUPE_HAVE_NCCL).
//
// One communicator per rank, made by join() on the rank's device thread from
// the group's ncclUniqueId. The communicators are nonblocking
// (ncclConfig_t::blocking = 0): every NCCL call returns at once and this file
// polls ncclCommGetAsyncError until the call is through, without holding any
// lock between polls. That is what lets abort() release a rank that waits
// for a peer which never comes, in ncclCommInitRankConfig or in the
// connection set-up of a first collective: abort() takes each rank's lock
// between two polls and calls ncclCommAbort, which also ends the rank's
// kernels still running on the device (a later synchronize of its stream
// returns). NCCL lets only one thread use a communicator at a time, so every
// NCCL call on a rank's communicator, abort's included, holds that rank's
// lock.
//
// Any failure (a call's result, an asynchronous error) aborts the whole
// group, so the peers' collectives throw too instead of waiting for this
// rank's part forever.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/nccl_id.hpp"
#include "devices/cuda_context.hpp"

namespace troupe {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(nccl_unique_id),
              "nccl_unique_id must hold an ncclUniqueId");

// One joined rank's communicator: owned by the rank's communicator object,
// reachable from the group for abort().
struct rank_slot {
  std::mutex m;  // held for every NCCL call on comm
  ncclComm_t comm = nullptr;
  bool gone = false;  // aborted or destroyed: comm must not be used
};

std::string nccl_failure(const char* what, int rank, const char* call, ncclResult_t r,
                         ncclComm_t comm) {
  std::string s = std::string(what) + ": rank " + std::to_string(rank) + ": " + call + ": " +
                  ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

class nccl_rendezvous final : public group_rendezvous,
                              public std::enable_shared_from_this<nccl_rendezvous> {
 public:
  nccl_rendezvous(int size, const ncclUniqueId& id)
      : n_(size), id_(id), joined_(static_cast<std::size_t>(size), false) {}

  int size() const override { return n_; }
  std::unique_ptr<process_group> join(int rank, device_context& ctx) override;

  void abort(const std::string& why) override {
    std::vector<std::shared_ptr<rank_slot>> slots;
    {
      std::lock_guard lock(mtx_);
      if (!aborted_) {
        aborted_ = true;
        why_ = why;
      }
      slots = slots_;
    }
    for (auto& s : slots) {
      std::lock_guard lock(s->m);
      if (s->gone) continue;
      s->gone = true;
      if (s->comm) ncclCommAbort(s->comm);
      s->comm = nullptr;
    }
  }

  nccl_unique_id id() const {
    nccl_unique_id out;
    std::memcpy(out.data(), &id_, sizeof id_);
    return out;
  }

  device_error aborted_error(const char* what) const {
    std::lock_guard lock(mtx_);
    return device_error(std::string(what) + ": the group was aborted: " +
                        (aborted_ ? why_ : std::string("its communicator is gone")));
  }

  // Polls rank's communicator until its last call is through. On an error,
  // aborts the group (so the peers do not wait for this rank) and throws.
  void wait_ready(rank_slot& s, int rank, const char* what) {
    for (int polls = 0;; ++polls) {
      std::string failure;
      {
        std::lock_guard lock(s.m);
        if (s.gone) break;
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(s.comm, &state);
        if (r != ncclSuccess)
          failure = nccl_failure(what, rank, "ncclCommGetAsyncError", r, s.comm);
        else if (state == ncclSuccess)
          return;
        else if (state != ncclInProgress)
          failure = nccl_failure(what, rank, "asynchronous error", state, s.comm);
      }
      if (!failure.empty()) fail(failure);
      // A collective is usually through at the first poll; initialisation
      // and connection set-up take milliseconds to seconds.
      if (polls < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(polls < 2000 ? 50 : 1000));
    }
    throw aborted_error(what);
  }

  [[noreturn]] void fail(const std::string& failure) {
    abort(failure);
    throw device_error(failure);
  }

 private:
  const int n_;
  const ncclUniqueId id_;
  // Guards what follows. Lock order: a slot's lock may be held when taking
  // mtx_, never the other way round (abort() copies the slots, then locks
  // them one by one).
  mutable std::mutex mtx_;
  bool aborted_ = false;
  std::string why_;
  std::vector<bool> joined_;
  std::vector<std::shared_ptr<rank_slot>> slots_;
};

class nccl_process_group final : public process_group {
 public:
  nccl_process_group(std::shared_ptr<nccl_rendezvous> g, std::shared_ptr<rank_slot> s, int rank,
                     cudaStream_t stream)
      : g_(std::move(g)), s_(std::move(s)), rank_(rank), stream_(stream) {}

  // Flushes and frees the communicator (ncclCommFinalize, then
  // ncclCommDestroy); if that does not finish in time (peers gone without an
  // abort), ncclCommAbort. Destroy it before its device context (whose
  // stream it uses).
  ~nccl_process_group() override {
    // Out of the group's reach first (abort() skips a gone slot), then the
    // polling without the lock: a peer's abort meanwhile must not wait on it.
    ncclComm_t c = nullptr;
    {
      std::lock_guard lock(s_->m);
      if (s_->gone) return;
      c = s_->comm;
      s_->gone = true;
      s_->comm = nullptr;
    }
    if (!c) return;
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommFinalize(c);
    if (r == ncclSuccess || r == ncclInProgress) {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      do {
        r = ncclCommGetAsyncError(c, &state);
        if (r != ncclSuccess || state != ncclInProgress) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } while (std::chrono::steady_clock::now() < until);
    }
    if (r == ncclSuccess && state == ncclSuccess)
      ncclCommDestroy(c);
    else
      ncclCommAbort(c);
  }

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }

  void all_reduce(float* data, std::size_t n, reduce_op op) override {
    require_device_reduce_op(op, "all_reduce");
    issue("all_reduce", "ncclAllReduce", n, [&](ncclComm_t c) {
      return ncclAllReduce(data, data, n, ncclFloat, nccl_op(op), c, stream_);
    });
  }
  // In place: rank r's result lands in its own chunk r of data.
  void reduce_scatter(float* data, std::size_t chunk, reduce_op op) override {
    require_device_reduce_op(op, "reduce_scatter");
    issue("reduce_scatter", "ncclReduceScatter", chunk, [&](ncclComm_t c) {
      return ncclReduceScatter(data, data + static_cast<std::size_t>(rank_) * chunk, chunk,
                               ncclFloat, nccl_op(op), c, stream_);
    });
  }
  // In place: rank r sends its own chunk r of data.
  void all_gather(float* data, std::size_t chunk) override {
    issue("all_gather", "ncclAllGather", chunk, [&](ncclComm_t c) {
      return ncclAllGather(data + static_cast<std::size_t>(rank_) * chunk, data, chunk, ncclFloat,
                           c, stream_);
    });
  }

  void broadcast(float* data, std::size_t n, int root) override {
    check_root(root);
    issue("broadcast", "ncclBroadcast", n,
          [&](ncclComm_t c) { return ncclBroadcast(data, data, n, ncclFloat, root, c, stream_); });
  }

  void check() override {
    std::string failure;
    {
      std::lock_guard lock(s_->m);
      if (!s_->gone) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(s_->comm, &state);
        if (r != ncclSuccess)
          failure = nccl_failure("check", rank_, "ncclCommGetAsyncError", r, s_->comm);
        else if (state != ncclSuccess && state != ncclInProgress)
          failure = nccl_failure("check", rank_, "asynchronous error", state, s_->comm);
        else
          return;
      }
    }
    if (!failure.empty()) g_->fail(failure);
    throw g_->aborted_error("device collectives");
  }

  void abort(const std::string& why) override { g_->abort(why); }

 private:
  // sum or mean (require_device_reduce_op).
  static ncclRedOp_t nccl_op(reduce_op op) { return op == reduce_op::mean ? ncclAvg : ncclSum; }

  // Enqueues one collective on the compute stream and waits until NCCL has
  // taken it (not until it has run: the stream orders what reads the result).
  // Zero elements: nothing is enqueued (every rank passes the same count).
  template <class F>
  void issue(const char* what, const char* call, std::size_t count, F&& enqueue) {
    std::string failure;
    {
      std::lock_guard lock(s_->m);
      if (!s_->gone) {
        if (count == 0) return;
        ncclResult_t r = enqueue(s_->comm);
        if (r != ncclSuccess && r != ncclInProgress)
          failure = nccl_failure(what, rank_, call, r, s_->comm);
      }
    }
    if (!failure.empty()) g_->fail(failure);
    // Throws the group's abort when the communicator is gone.
    g_->wait_ready(*s_, rank_, what);
  }

  std::shared_ptr<nccl_rendezvous> g_;
  std::shared_ptr<rank_slot> s_;
  int rank_;
  cudaStream_t stream_;
};

std::unique_ptr<process_group> nccl_rendezvous::join(int rank, device_context& ctx) {
  const std::string who = "nccl: rank " + std::to_string(rank);
  if (rank < 0 || rank >= n_)
    throw device_error(who + " is outside the group of " + std::to_string(n_) + " ranks");
  if (ctx.spec().kind != device_spec::kind_t::cuda)
    throw device_error(who + " joined with " + ctx.spec().str() +
                       ", but an NCCL group's devices are cuda:N");
  if (cudaError_t e = cudaSetDevice(ctx.spec().index); e != cudaSuccess)
    throw device_error(who + ": cudaSetDevice(" + std::to_string(ctx.spec().index) +
                       "): " + cudaGetErrorString(e));
  auto stream = static_cast<cudaStream_t>(cuda_compute_stream(ctx));
  auto slot = std::make_shared<rank_slot>();
  {
    std::lock_guard lock(mtx_);
    if (aborted_) throw device_error(who + " cannot join: the group was aborted: " + why_);
    if (joined_[static_cast<std::size_t>(rank)]) throw device_error(who + " joined twice");
    joined_[static_cast<std::size_t>(rank)] = true;
    slots_.push_back(slot);
  }
  const std::string what = who + " joining (" + ctx.spec().str() + ")";
  std::string failure;
  bool gone = false;
  {
    std::lock_guard lock(slot->m);
    gone = slot->gone;  // aborted since the registration above
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r =
        gone ? ncclSuccess : ncclCommInitRankConfig(&slot->comm, n_, id_, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      failure = what + ": ncclCommInitRankConfig: " + ncclGetErrorString(r);
  }
  if (gone) throw aborted_error(what.c_str());
  if (!failure.empty()) fail(failure);  // the group's abort frees a half-made comm
  wait_ready(*slot, rank, what.c_str());
  return std::make_unique<nccl_process_group>(shared_from_this(), slot, rank, stream);
}

}  // namespace

bool built_with_nccl() noexcept {
  return true;
}

std::shared_ptr<group_rendezvous> make_nccl_rendezvous(int size) {
  if (size < 1)
    throw device_error("nccl: a group needs at least 1 rank, not " + std::to_string(size));
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    throw device_error(std::string("nccl: ncclGetUniqueId: ") + ncclGetErrorString(r) +
                       (last && *last ? std::string(" (") + last + ")" : std::string()));
  }
  return std::make_shared<nccl_rendezvous>(size, id);
}

std::shared_ptr<group_rendezvous> make_nccl_rendezvous(int size, nccl_unique_id id) {
  if (size < 1)
    throw device_error("nccl: a group needs at least 1 rank, not " + std::to_string(size));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  return std::make_shared<nccl_rendezvous>(size, nid);
}

nccl_unique_id nccl_group_id(const group_rendezvous& g) {
  auto* n = dynamic_cast<const nccl_rendezvous*>(&g);
  if (!n) throw device_error("nccl_group_id: this device collective group is not an NCCL group");
  return n->id();
}

}  // namespace troupe
