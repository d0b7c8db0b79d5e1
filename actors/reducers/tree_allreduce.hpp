#pragma once
// tree: reduce up a k-ary tree, broadcast the result down it, chunk by chunk
// (a parent combines chunk c as soon as all its children's partials of c are
// in, so levels overlap). Few hops: for small tensors, where latency rules.
// With arity 1 the tree is a chain (the ring's pipelined broadcast), with
// arity n-1 it is flat (reduce_to_one).
#include "actors/reducers/collective.hpp"

namespace troupe::reducers {

// The tree over ranks rooted at `root`: virtual rank v = (rank - root) mod n,
// parent (v - 1) / arity, children arity*v + 1 .. arity*v + arity.
int tree_parent(int arity, int rank, int n, int root);  // -1 for the root
std::vector<int> tree_children(int arity, int rank, int n, int root);

// All-reduce rooted at rank 0, broadcast rooted at link::root.
plan tree_wire(int arity, int rank, int n, collective_kind kind, int32_t root);
std::unique_ptr<bucket_op> make_tree_op(int arity, link& l, int32_t bucket, int64_t begin,
                                        int64_t end);

class tree_allreduce final : public algorithm {
 public:
  static constexpr int arity = 2;
  const char* name() const override { return "tree"; }
  plan wire(int rank, int n, collective_kind kind, int32_t root) const override {
    return tree_wire(arity, rank, n, kind, root);
  }
  std::unique_ptr<bucket_op> make(link& l, int32_t bucket, int64_t begin,
                                  int64_t end) const override {
    return make_tree_op(arity, l, bucket, begin, end);
  }
};

}  // namespace troupe::reducers
