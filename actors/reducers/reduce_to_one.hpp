#pragma once
// reduce_to_one: every rank's data is combined onto rank 0 in one pass over
// all buffers, then rank 0 writes the result into every rank (the flat tree:
// depth one). Broadcast: the root writes into every rank. Simple, two hops,
// but rank 0 does all the combining and copying.
#include "actors/reducers/tree_allreduce.hpp"

namespace troupe::reducers {

class reduce_to_one final : public algorithm {
 public:
  explicit reduce_to_one(int n) : arity_(n > 1 ? n - 1 : 1) {}
  const char* name() const override { return "reduce_to_one"; }
  plan wire(int rank, int n, collective_kind kind, int32_t root) const override;
  std::unique_ptr<bucket_op> make(link& l, int32_t bucket, int64_t begin,
                                  int64_t end) const override;

 private:
  int arity_;
};

}  // namespace troupe::reducers
