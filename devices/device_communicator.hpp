#pragma once
// device_communicator: one rank's collectives on device memory, enqueued on
// its device's compute stream (after the gradients that feed them, before
// the update that reads them), so a step's all-reduce needs no round trip
// through the actors. Used by mirrored when strategy.reducer.algorithm is
// "device":
//   cuda:N        NCCL (devices/nccl_communicator.cpp): one communicator per
//                 rank, initialised from the group's ncclUniqueId;
//   cpu:N, sim:N  an in-process group in host memory with the same contract
//                 (devices/host_communicator.cpp), so the strategy's use of
//                 device collectives is tested on the CPU.
// A failure (a peer's error, an abort) throws device_error naming the
// collective and the cause on every rank; abort() ends the group's pending
// and future collectives on every rank (a lost peer must not leave the others
// blocked forever).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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

class device_communicator {
 public:
  virtual ~device_communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place over n floats of this rank's device memory. op: sum or mean.
  virtual void all_reduce(float* data, std::size_t n, reduce_op op) = 0;
  // data holds size() * chunk floats; rank r ends with the reduction of
  // chunk r in data[r*chunk, (r+1)*chunk) (the rest is undefined).
  virtual void reduce_scatter(float* data, std::size_t chunk, reduce_op op) = 0;
  // data holds size() * chunk floats; rank r's chunk r goes to every rank.
  virtual void all_gather(float* data, std::size_t chunk) = 0;
  // All-reduce over the spans taken as one buffer (a model's gradients, one
  // span per variable; every rank passes spans of the same sizes). Here one
  // all_reduce per span; a link between processes sends them as one.
  virtual void all_reduce_spans(const std::vector<float_span>& spans, reduce_op op) {
    for (const auto& s : spans) all_reduce(s.data, s.size, op);
  }
  // The same three, issued: the collective may still be running when the
  // call returns, and until complete() the caller neither touches `data` nor
  // passes it to another collective. In the host group (cpu:N, sim:N) a rank
  // goes on computing while its peers catch up, each rank does its share of
  // a collective as soon as every rank has issued it (the last to come at
  // once, its data hot in its cache), and a step's dozen collectives cost
  // one wait where the plain calls cost two rendezvous each. NCCL orders
  // every collective on the compute stream anyway: there they are the plain
  // calls.
  virtual void issue_all_reduce(float* data, std::size_t n, reduce_op op) {
    all_reduce(data, n, op);
  }
  virtual void issue_reduce_scatter(float* data, std::size_t chunk, reduce_op op) {
    reduce_scatter(data, chunk, op);
  }
  virtual void issue_all_gather(float* data, std::size_t chunk) { all_gather(data, chunk); }
  // Returns once every collective this rank has issued is done on every
  // rank (host group: the results are in this rank's buffers and no peer
  // reads or writes them any more; NCCL: they are ordered before any later
  // work on the stream), then as check(). A collective the ranks issued
  // differently throws here on every rank, and the group stays in step.
  virtual void complete() { check(); }
  // Throws device_error if a collective of this group failed asynchronously
  // (ncclCommGetAsyncError) or the group was aborted.
  virtual void check() = 0;
  // Ends the group: collectives in flight or issued later throw on every rank.
  virtual void abort(const std::string& why) = 0;
};

// What the ranks of one group share before they have communicators: the
// group's identity (NCCL: the ncclUniqueId, 128 bytes, made by rank 0 and
// carried to the others; across processes as a CAF message). Thread-safe.
class device_collective_group {
 public:
  virtual ~device_collective_group() = default;
  virtual int size() const = 0;
  // Called once per rank, on that rank's device thread, with its context;
  // may block until every rank has joined (NCCL's ncclCommInitRank).
  // Throws device_error naming the rank and the cause.
  virtual std::unique_ptr<device_communicator> join(int rank, device_context& ctx) = 0;
  // Aborts every joined rank's communicator (a replica failed).
  virtual void abort(const std::string& why) = 0;
};

// A group of `size` ranks in this process whose devices are all of the
// kind of `spec` (cuda: NCCL; cpu/sim: host memory). Throws device_error for
// a mix of kinds or a build without NCCL when cuda is asked for.
std::shared_ptr<device_collective_group> make_device_collective_group(int size,
                                                                      const device_spec& spec);

}  // namespace troupe
