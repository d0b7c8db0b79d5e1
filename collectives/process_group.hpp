#pragma once
// The collective layer: process_group is the one interface (PyTorch c10d's
// ProcessGroup) through which a strategy issues its collectives, whatever
// runs them. One object per rank; the ranks of a group meet through a
// group_rendezvous. Backends:
//
//   host group      collectives/host_group.cpp     ranks of one process on
//                                                  cpu:N and sim:N devices
//   NCCL            collectives/nccl_group.cpp     cuda:N, in one process or
//                                                  one communicator over a job
//   reducer actors  actors/reducer_group.hpp       the ring, tree and
//                                                  reduce_to_one actors, or a
//                                                  process's ring node
//   process ring    runtime/process_ring.hpp       a ring of processes on
//                                                  sockets of its own
//   hierarchical    collectives/hierarchical_group.hpp  a group in the process,
//                                                  one across processes, back
//
// Issue and wait. issue_*() returns a `work` at once; the collective may still
// run while the caller goes on (the host group lets a rank compute while its
// peers catch up; NCCL orders it on the compute stream; the actors run it on
// their own threads). Until its work is waited for (or complete() returns),
// the caller neither touches the buffer nor passes it to another collective.
// A rank's collectives complete in the order it issued them, as on a stream,
// and every rank of a group issues the same collectives in the same order
// (a difference fails the collective on every rank, naming it).
//
// Memory. memory() says where the buffers are: the device's own (NCCL; the
// host group, whose cpu/sim device memory is host memory) or the host's (the
// actors and the sockets): a step on a discrete device stages its gradients
// to the host for a host-memory group.
//
// Failure. A failure (a peer's error, an abort, a lost process) throws
// device_error naming the collective and the cause on every rank; abort()
// (from any thread) ends the group's pending and future collectives on every
// rank, so no rank is left blocked. An aborted group stays failed: the ranks
// that are left form a new group over themselves (their backend's rendezvous
// made anew with the new size, ranks renumbered in order), which is how a
// strategy goes on without a lost rank.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "devices/device_context.hpp"
#include "messages/reduce_op.hpp"

namespace troupe {

// Device collectives reduce by sum or mean (what gradients need; NCCL's
// ncclSum and ncclAvg). min and max throw device_error naming the collective
// on every device kind, so the host group keeps NCCL's contract; the reducer
// actors (strategy.reducer.algorithm ring, tree, reduce_to_one) do all four.
void require_device_reduce_op(reduce_op op, const char* collective);

// A contiguous run of floats of the caller's (a variable's gradient).
struct float_span {
  float* data = nullptr;
  std::size_t size = 0;
};

class process_group;

// One issued collective (c10d's Work). wait() returns once it is done on
// this rank, and with it every collective this rank issued before it; it
// throws as process_group::complete() does. A default-made work is done.
class work {
 public:
  work() = default;
  void wait();

 private:
  friend class process_group;
  work(process_group* group, uint64_t ticket) : group_(group), ticket_(ticket) {}
  process_group* group_ = nullptr;
  uint64_t ticket_ = 0;
};

class process_group {
 public:
  enum class memory_kind { device, host };

  virtual ~process_group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual memory_kind memory() const { return memory_kind::device; }
  // Whether an issued collective completes without this rank's thread (the
  // reducer actors): it may then stay in flight past the task that issued
  // it, to be completed by whichever task comes next. False where the
  // ranks' own threads move the data in complete() (the host group), so
  // every rank must complete at the same point of its work.
  virtual bool completes_on_its_own() const { return false; }

  // --- plain collectives: done on every rank when they return ---

  // In place over n floats. op: sum or mean (the reducer actors: all four).
  virtual void all_reduce(float* data, std::size_t n, reduce_op op) = 0;
  // data holds size() * chunk floats; rank r ends with the reduction of
  // chunk r in data[r*chunk, (r+1)*chunk) (the rest is undefined).
  virtual void reduce_scatter(float* data, std::size_t chunk, reduce_op op) = 0;
  // data holds size() * chunk floats; rank r's chunk r goes to every rank.
  virtual void all_gather(float* data, std::size_t chunk) = 0;
  // Rank root's n floats to every rank. Here: the other ranks zero theirs
  // and all of them sum (exact: x + 0 is x), for backends whose buffers
  // the host can write; NCCL overrides it.
  virtual void broadcast(float* data, std::size_t n, int root);
  // All-reduce over the spans taken as one buffer (a model's gradients, one
  // span per variable; every rank passes spans of the same sizes). Here one
  // all_reduce per span; a link between processes sends them as one.
  virtual void all_reduce_spans(const std::vector<float_span>& spans, reduce_op op) {
    for (const auto& s : spans) all_reduce(s.data, s.size, op);
  }

  // --- issued collectives: see the header comment ---
  //
  // Here they are the plain calls (done when issued). The host group lets
  // a rank go on computing while its peers catch up: each rank does its
  // share of a collective as soon as every rank has issued it, and a
  // step's dozen collectives cost one wait. NCCL orders them on the compute
  // stream. The reducer actors run them on their own threads.
  virtual work issue_all_reduce(float* data, std::size_t n, reduce_op op) {
    all_reduce(data, n, op);
    return issued();
  }
  virtual work issue_reduce_scatter(float* data, std::size_t chunk, reduce_op op) {
    reduce_scatter(data, chunk, op);
    return issued();
  }
  virtual work issue_all_gather(float* data, std::size_t chunk) {
    all_gather(data, chunk);
    return issued();
  }
  virtual work issue_broadcast(float* data, std::size_t n, int root) {
    broadcast(data, n, root);
    return issued();
  }
  // --- ZeRO stage 1 over a model's buffers, in the backend's layout ---
  //
  // `spans`: one per variable, in the model's order, the same sizes on
  // every rank. shard_ranges(grads) says which elements (of the spans taken
  // as one buffer) this rank owns: after reduce-scattering the gradients
  // they hold the reduction (the rest is undefined), the rank updates them,
  // and all_gather_spans spreads every rank's owned elements to all.
  // reduce_scatter_spans may be issued a few variables at a time (as
  // backward makes them), each variable once per step, before one wait.
  // Here: a variable the ranks divide is split into a chunk per rank (rank
  // r owns chunk r), any other is all-reduced and owned by every rank; the
  // reducer actors use their own segments.
  using element_ranges = std::vector<std::pair<int64_t, int64_t>>;
  virtual element_ranges shard_ranges(const std::vector<float_span>& grads);
  virtual work issue_reduce_scatter_spans(const std::vector<float_span>& spans, reduce_op op);
  virtual work issue_all_gather_spans(const std::vector<float_span>& spans);

  // Returns once every collective this rank has issued is done on every
  // rank (the results are in this rank's buffers and no peer reads or
  // writes them any more; NCCL: they are ordered before any later work on
  // the stream), then as check(). A collective the ranks issued differently
  // throws here on every rank, and the group stays in step.
  virtual void complete() { check(); }
  // Throws device_error if a collective of this group failed asynchronously
  // (ncclCommGetAsyncError) or the group was aborted.
  virtual void check() = 0;
  // Ends the group: collectives in flight or issued later throw on every rank.
  virtual void abort(const std::string& why) = 0;
  // Ends this rank's part only: its waits and later collectives throw at
  // once, and the peers are not told (they end theirs as their own ranks
  // stop). A replica that ends uses it, so that the job's failure names the
  // replica that failed and not a peer its abort failed in turn. Here, for
  // groups that cannot tell one rank from all: abort().
  virtual void stop_waiting(const std::string& why) { abort(why); }

 protected:
  // The work of the collective just issued (the next ticket).
  work issued() { return work(this, ++issued_); }
  // Returns once the collective with `ticket` (and every earlier one) is
  // done. Here: complete(); a backend that can tell one collective from the
  // next waits for that one only.
  virtual void wait_for(uint64_t ticket) {
    (void)ticket;
    complete();
  }
  uint64_t issued_count() const { return issued_; }
  // Throws unless `root` is a rank of this group (every broadcast checks).
  void check_root(int root) const;

 private:
  friend class work;
  uint64_t issued_ = 0;
};

// What the ranks of one group share before they have their process_group: the
// group's identity (NCCL: the ncclUniqueId, 128 bytes, made by rank 0 and
// carried to the others; across processes as a CAF message). Thread-safe.
class group_rendezvous {
 public:
  virtual ~group_rendezvous() = default;
  virtual int size() const = 0;
  // Called once per rank, on that rank's device thread, with its context;
  // may block until every rank has joined (NCCL's ncclCommInitRank).
  // Throws device_error naming the rank and the cause.
  virtual std::unique_ptr<process_group> join(int rank, device_context& ctx) = 0;
  // Aborts every joined rank's group (a replica failed).
  virtual void abort(const std::string& why) = 0;
};

// A group of `size` ranks in this process whose devices are all of the
// kind of `spec` (cuda: NCCL; cpu/sim: host memory). Throws device_error for
// a mix of kinds or a build without NCCL when cuda is asked for.
std::shared_ptr<group_rendezvous> make_device_rendezvous(int size, const device_spec& spec);

}  // namespace troupe
