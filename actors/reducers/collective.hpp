#pragma once
// What every reduction algorithm shares: a rank's tensors seen as one virtual
// concatenated float buffer, the element-wise kernels, and the small
// interface between the reducer actor (actors/reducer.cpp: requests,
// sequence numbers, buffering, validation, release, abort) and an algorithm
// (actors/reducers/*.cpp: which region to combine or copy when a peer says
// "ready").
//
// Inside one process a "send" never carries data: it is a reduce_peer_msg
// telling the receiver that a region is ready, and the data moves by reading
// or writing the peer's buffers directly. The rules that keep this free of
// data races:
//  - pull (ring): a rank reads a peer's region only between the peer's
//    "ready" for it and a point where the peer provably no longer writes it;
//    a rank replies to its caller (who may then write the tensors again) only
//    when every peer that reads its buffers has said so ("release");
//  - push (tree, reduce_to_one, broadcasts): a rank writes a peer's region
//    only after that peer has said "ready" for it (or, down a tree, after the
//    writer's own parent has), and the peer touches it again only when told.
// The happens-before between a message's sender and its receiver is CAF's
// mailbox; actors/visible_mailbox.hpp shows it to ThreadSanitizer.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "messages/messages.hpp"

namespace troupe::reducers {

// reduce_scatter and all_gather are the ring's two halves on their own (every
// algorithm runs them as the ring does; see actors/reducer.hpp).
enum class collective_kind : uint8_t {
  allreduce = 0,
  broadcast = 1,
  reduce_scatter = 2,
  all_gather = 3
};

// A rank's tensors of one collective as one virtual buffer of numel() floats
// (no copy: the tensors are the caller's, this only holds references).
struct flat_view {
  std::vector<tensor> tensors;
  std::vector<float*> data;      // tensors[i]'s floats (null when empty)
  std::vector<int64_t> offsets;  // offsets[i]: where tensor i starts; back(): numel

  flat_view() : offsets{0} {}
  // data[i] is null for tensors that are not float32 (the reducer refuses
  // those before any algorithm runs).
  explicit flat_view(std::vector<tensor> ts);
  int64_t numel() const noexcept { return offsets.back(); }

  // Calls f(tensor_index, offset_in_tensor, length) for the pieces of the
  // virtual range [a, b), in order.
  template <class F>
  void for_pieces(int64_t a, int64_t b, F&& f) const {
    if (a >= b) return;
    std::size_t i = first_tensor(a);
    while (a < b) {
      int64_t end = offsets[i + 1] < b ? offsets[i + 1] : b;
      if (end > a) f(i, a - offsets[i], end - a);
      a = end;
      ++i;
    }
  }

 private:
  std::size_t first_tensor(int64_t a) const;
};

// What a rank publishes for the collective it is in: its request and buffers.
struct posted {
  uint64_t seq = 0;
  collective_kind kind = collective_kind::allreduce;
  reduce_op op = reduce_op::sum;
  int32_t root = 0;
  flat_view view;
};

// Empty when ranks a (posted a) and b (posted b) made compatible calls; else
// what differs, for the error message.
std::string compare_posted(int rank_a, const posted& a, int rank_b, const posted& b);

// --- kernels: element-wise, in place, on one thread ---

// acc = acc (op) x; sum and mean both add.
void combine(float* acc, const float* x, int64_t n, reduce_op op);
// acc = (acc (op) x) * scale for mean, acc (op) x otherwise.
void combine_final(float* acc, const float* x, int64_t n, reduce_op op, float scale);
// acc = (acc (op) xs[0] (op) ... xs[m-1]) [* scale for mean], one pass over
// memory (blocked so acc stays in L1 while the sources stream by).
void combine_many(float* acc, const float* const* xs, int m, int64_t n, reduce_op op, float scale);
void copy_floats(float* dst, const float* src, int64_t n);

// --- algorithm interface ---

// Thrown by link::peer() (and by algorithms given steps that make no sense)
// when ranks made different calls; the reducer fails the collective on every
// rank with what() as the reason.
struct peer_mismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What an algorithm's bucket step sees of its rank.
class link {
 public:
  virtual ~link() = default;
  int rank = 0;
  int n = 1;
  collective_kind kind = collective_kind::allreduce;
  reduce_op op = reduce_op::sum;
  int32_t root = 0;         // broadcast only
  int64_t chunk_elems = 1;  // pipelining granularity, in floats
  const flat_view* mine = nullptr;
  float mean_scale() const { return op == reduce_op::mean ? 1.0f / static_cast<float>(n) : 1.0f; }

  // The buffers of peer p in this collective (compared with ours on first
  // use; a difference fails the collective on every rank).
  virtual const flat_view& peer(int p) = 0;
  // Tells peer `to` that step (kind >= 0, arg) of `bucket` is ready.
  virtual void send(int to, int32_t bucket, int32_t kind, int64_t arg) = 0;
};

// One bucket of one collective on one rank. The constructor wires the plan
// (regions, peers, what to expect); start() sends what is ready at once;
// on_message() does one short step per peer message.
class bucket_op {
 public:
  virtual ~bucket_op() = default;
  virtual void start() = 0;
  virtual void on_message(int from, int32_t kind, int64_t arg) = 0;
  // This rank's part of the bucket is final and it reads no peer buffers any more.
  virtual bool done() const = 0;
};

// Who reads whose buffers in a collective (the same for all its buckets).
struct plan {
  std::vector<int> release_to;  // peers whose buffers this rank reads
  int readers = 0;              // peers that read this rank's buffers
};

class algorithm {
 public:
  virtual ~algorithm() = default;
  virtual const char* name() const = 0;
  virtual plan wire(int rank, int n, collective_kind kind, int32_t root) const = 0;
  // Elements [begin, end) of the virtual buffer, at least one bucket per
  // collective (possibly empty, so that every collective exchanges messages).
  virtual std::unique_ptr<bucket_op> make(link& l, int32_t bucket, int64_t begin,
                                          int64_t end) const = 0;
};

// Splits [begin, end) into `parts` consecutive ranges (boundaries aligned to
// 16 floats where the length allows); returns parts + 1 boundaries.
std::vector<int64_t> split_range(int64_t begin, int64_t end, int64_t parts);
// Number of chunks of at most `chunk` elements in `len` (at least 1).
inline int64_t chunk_count(int64_t len, int64_t chunk) {
  return len <= chunk ? 1 : (len + chunk - 1) / chunk;
}

}  // namespace troupe::reducers
