#include "actors/reducers/tree_allreduce.hpp"

#include <algorithm>

namespace troupe::reducers {

int tree_parent(int arity, int rank, int n, int root) {
  int v = (rank - root + n) % n;
  if (v == 0) return -1;
  return ((v - 1) / arity + root) % n;
}

std::vector<int> tree_children(int arity, int rank, int n, int root) {
  int v = (rank - root + n) % n;
  std::vector<int> c;
  for (int64_t i = int64_t{arity} * v + 1; i <= int64_t{arity} * v + arity && i < n; ++i)
    c.push_back(static_cast<int>((i + root) % n));
  return c;
}

plan tree_wire(int, int, int, collective_kind, int32_t) {
  // Results are pushed, never pulled: a parent reads its children's partials
  // on the way up and writes the result into their buffers on the way down,
  // and "down" tells the child that nobody touches its chunk any more. So no
  // rank reads another's buffers after that rank has its result: no releases.
  return {};
}

namespace {

// Buckets up to this many floats go down in one hop: the root writes the
// result into every rank and tells each one (latency); larger ones go down
// the tree, each parent writing into its children (spreads the copying).
constexpr int64_t flat_down_elems = 16 << 10;

class tree_op final : public bucket_op {
 public:
  enum : int32_t { up = 0, down = 1 };  // arg: chunk index

  tree_op(int arity, link& l, int32_t bucket, int64_t begin, int64_t end)
      : l_(l), bucket_(bucket), begin_(begin), end_(end) {
    root_ = l.kind == collective_kind::allreduce ? 0 : l.root;
    parent_ = tree_parent(arity, l.rank, l.n, root_);
    children_ = tree_children(arity, l.rank, l.n, root_);
    chunks_ = chunk_count(end - begin, l.chunk_elems);
    flat_down_ = end - begin <= flat_down_elems || arity >= l.n - 1;
    // Who this rank writes the result into: everyone (flat root), its
    // children (down the tree), or nobody (a flat non-root).
    if (flat_down_ && parent_ < 0) {
      for (int p = 0; p < l.n; ++p)
        if (p != l.rank) targets_.push_back(p);
    } else if (!flat_down_) {
      targets_ = children_;
    }
    if (l.kind == collective_kind::allreduce) ready_.assign(static_cast<std::size_t>(chunks_), 0);
  }

  void start() override {
    if (l_.kind == collective_kind::allreduce) {
      if (!children_.empty()) return;  // waits for its children's partials
      if (parent_ < 0) {               // a group of one
        final_ = chunks_;
        return;
      }
      for (int64_t c = 0; c < chunks_; ++c) l_.send(parent_, bucket_, up, c);
    } else if (parent_ < 0) {  // broadcast root: its data is the result
      for (int64_t c = 0; c < chunks_; ++c) push_down(c);
      final_ = chunks_;
    }
  }

  void on_message(int from, int32_t kind, int64_t c) override {
    if (kind == up) {
      (void)l_.peer(from);  // checks the child's call before trusting `c`
      if (c < 0 || c >= chunks_)
        throw peer_mismatch("tree: chunk " + std::to_string(c) + " out of range");
      // All children's partials of chunk c are in (they wait for "down").
      if (++ready_[static_cast<std::size_t>(c)] < static_cast<int>(children_.size())) return;
      reduce_chunk(c);
      if (parent_ >= 0) {
        l_.send(parent_, bucket_, up, c);
      } else {
        push_down(c);
        ++final_;
      }
    } else {
      // Our chunk c holds the result (written by the root or our parent,
      // who checked our call against theirs before; a sender running some
      // other call is reported as such by peer()).
      if (c < 0 || c >= chunks_) {
        (void)l_.peer(from);
        throw peer_mismatch("tree: chunk " + std::to_string(c) + " out of range");
      }
      if (!flat_down_) push_down(c);
      ++final_;
    }
  }

  bool done() const override { return final_ == chunks_; }

 private:
  std::pair<int64_t, int64_t> chunk(int64_t c) const {
    int64_t a = begin_ + c * l_.chunk_elems;
    return {a, std::min(end_, a + l_.chunk_elems)};
  }

  // Our chunk c (op)= every child's chunk c (their subtrees' partials), in one
  // pass; the root also applies mean's 1/n.
  void reduce_chunk(int64_t c) {
    auto [a, b] = chunk(c);
    std::vector<const flat_view*> srcs;
    for (int child : children_) srcs.push_back(&l_.peer(child));
    bool root = parent_ < 0;
    reduce_op op = (!root && l_.op == reduce_op::mean) ? reduce_op::sum : l_.op;
    reduce_op partial = op == reduce_op::mean ? reduce_op::sum : op;
    const float* ptrs[16];
    l_.mine->for_pieces(a, b, [&](std::size_t i, int64_t off, int64_t len) {
      int m = 0;
      for (auto* s : srcs) {
        ptrs[m++] = s->data[i] + off;
        if (m == 16) {  // wide trees: sources in batches of 16
          combine_many(l_.mine->data[i] + off, ptrs, m, len, partial, 1.0f);
          m = 0;
        }
      }
      combine_many(l_.mine->data[i] + off, ptrs, m, len, op, l_.mean_scale());
    });
  }

  // Our chunk c is final: write it into the ranks below us (all of them when
  // flat), then tell them. They do not touch that chunk until told.
  void push_down(int64_t c) {
    auto [a, b] = chunk(c);
    for (int t : targets_) {
      const flat_view& dst = l_.peer(t);
      l_.mine->for_pieces(a, b, [&](std::size_t i, int64_t off, int64_t len) {
        copy_floats(dst.data[i] + off, l_.mine->data[i] + off, len);
      });
    }
    for (int t : targets_) l_.send(t, bucket_, down, c);
  }

  link& l_;
  int32_t bucket_;
  int64_t begin_, end_;
  int root_ = 0;
  int parent_ = -1;
  std::vector<int> children_;
  std::vector<int> targets_;  // ranks this one writes the result into
  int64_t chunks_ = 1;
  bool flat_down_ = true;
  std::vector<int> ready_;  // per chunk: children whose partial is in
  int64_t final_ = 0;       // chunks holding the result
};

}  // namespace

std::unique_ptr<bucket_op> make_tree_op(int arity, link& l, int32_t bucket, int64_t begin,
                                        int64_t end) {
  return std::make_unique<tree_op>(arity, l, bucket, begin, end);
}

}  // namespace troupe::reducers
