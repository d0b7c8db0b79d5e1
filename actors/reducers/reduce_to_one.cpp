#include "actors/reducers/reduce_to_one.hpp"

namespace troupe::reducers {

// A tree whose root has all other ranks as children: they say "up" for each
// chunk, rank 0 combines chunk c of all n buffers at once (one read of each,
// one write) when the last "up" for c is in, writes the result into every
// rank's chunk c and says "down" to each.
plan reduce_to_one::wire(int rank, int n, collective_kind kind, int32_t root) const {
  return tree_wire(arity_, rank, n, kind, root);
}

std::unique_ptr<bucket_op> reduce_to_one::make(link& l, int32_t bucket, int64_t begin,
                                               int64_t end) const {
  return make_tree_op(arity_, l, bucket, begin, end);
}

}  // namespace troupe::reducers
