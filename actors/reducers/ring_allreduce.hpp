#pragma once
// ring: reduce-scatter then all-gather around the ring 0 -> 1 -> ... -> n-1
// -> 0, each segment cut into chunks of chunk_bytes so that rank i+1 combines
// chunk k while rank i produces chunk k+1. Every rank moves 2(n-1)/n of the
// data: the bandwidth algorithm. Broadcast is the pipelined chain from the
// root (a tree of arity 1). Each half also runs on its own (reduce_scatter,
// all_gather), for every algorithm: rank r holds segment r+1 of each bucket.
#include "actors/reducers/collective.hpp"

namespace troupe::reducers {

class ring_allreduce final : public algorithm {
 public:
  const char* name() const override { return "ring"; }
  plan wire(int rank, int n, collective_kind kind, int32_t root) const override;
  std::unique_ptr<bucket_op> make(link& l, int32_t bucket, int64_t begin,
                                  int64_t end) const override;
};

}  // namespace troupe::reducers
