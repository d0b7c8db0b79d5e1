#include "actors/reducers/ring_allreduce.hpp"

#include <algorithm>

#include "actors/reducers/tree_allreduce.hpp"

namespace troupe::reducers {

namespace {

// One bucket, split into n segments. Reduce-scatter step t (0 <= t < n-1):
// rank r combines segment (r-1-t) mod n of rank r-1 into its own and passes it
// on; after step n-2 rank r holds the result of segment r+1. All-gather step
// t: rank r copies segment (r-t) mod n from rank r-1 and passes it on.
//
// Why rank r may read rank r-1's region: r-1 wrote it before saying "ready"
// and writes it again only in the all-gather, when the result of that segment
// comes round, which happens after r (and everyone after it in the chain) has
// combined it. In the all-gather nobody writes a region after passing it on.
class ring_op final : public bucket_op {
 public:
  enum : int32_t { reduce_scatter = 0, all_gather = 1 };  // arg: step << 32 | chunk

  ring_op(link& l, int32_t bucket, int64_t begin, int64_t end)
      : l_(l), bucket_(bucket), n_(l.n), r_(l.rank) {
    next_ = (r_ + 1) % n_;
    prev_ = (r_ + n_ - 1) % n_;
    seg_ = split_range(begin, end, n_);
    for (int s = 0; s < n_; ++s) {
      chunks_.push_back(chunk_count(seg_[s + 1] - seg_[s], l.chunk_elems));
      max_chunks_ = std::max(max_chunks_, chunks_.back());
      if (s != r_ && l.kind != collective_kind::all_gather)
        expected_ += chunks_.back();  // reduce-scatter receives
      if (s != next_ && l.kind != collective_kind::reduce_scatter)
        expected_ += chunks_.back();  // all-gather receives
    }
  }

  // An all-gather on its own starts where the reduce-scatter ends: this rank
  // holds segment r+1 and passes it on.
  void start() override {
    if (l_.kind == collective_kind::all_gather) {
      for (int64_t k = 0; k < chunks_[next_]; ++k) l_.send(next_, bucket_, all_gather, pack(0, k));
      return;
    }
    for (int64_t k = 0; k < chunks_[r_]; ++k) l_.send(next_, bucket_, reduce_scatter, pack(0, k));
  }

  void on_message(int, int32_t kind, int64_t arg) override {
    int t = static_cast<int>(arg >> 32);
    int64_t k = arg & 0xffffffff;
    const flat_view& src = l_.peer(prev_);  // checks rank-1's call before trusting `arg`
    if (t < 0 || t > n_ - 2 || k < 0 || k >= max_chunks_)
      throw peer_mismatch("ring: step " + std::to_string(t) + " chunk " + std::to_string(k) +
                          " out of range");
    float* const* own = l_.mine->data.data();
    if (kind == reduce_scatter) {
      auto [a, b] = chunk(mod(r_ - 1 - t), k);
      bool last = t == n_ - 2;  // this rank holds the result of this segment
      float scale = l_.mean_scale();
      l_.mine->for_pieces(a, b, [&](std::size_t i, int64_t off, int64_t len) {
        if (last)
          combine_final(own[i] + off, src.data[i] + off, len, l_.op, scale);
        else
          combine(own[i] + off, src.data[i] + off, len, l_.op);
      });
      if (!last)
        l_.send(next_, bucket_, reduce_scatter, pack(t + 1, k));
      else if (l_.kind == collective_kind::allreduce)
        l_.send(next_, bucket_, all_gather, pack(0, k));
    } else {
      auto [a, b] = chunk(mod(r_ - t), k);
      l_.mine->for_pieces(a, b, [&](std::size_t i, int64_t off, int64_t len) {
        copy_floats(own[i] + off, src.data[i] + off, len);
      });
      if (t + 1 <= n_ - 2) l_.send(next_, bucket_, all_gather, pack(t + 1, k));
    }
    ++received_;
  }

  bool done() const override { return received_ == expected_; }

 private:
  static int64_t pack(int step, int64_t chunk) { return (int64_t{step} << 32) | chunk; }
  int mod(int x) const { return ((x % n_) + n_) % n_; }
  std::pair<int64_t, int64_t> chunk(int s, int64_t k) const {
    int64_t a = seg_[s] + k * l_.chunk_elems;
    return {a, std::min(seg_[s + 1], a + l_.chunk_elems)};
  }

  link& l_;
  int32_t bucket_;
  int n_, r_, next_ = 0, prev_ = 0;
  std::vector<int64_t> seg_;     // n + 1 segment boundaries
  std::vector<int64_t> chunks_;  // chunks per segment
  int64_t max_chunks_ = 1;
  int64_t expected_ = 0;
  int64_t received_ = 0;
};

}  // namespace

plan ring_allreduce::wire(int rank, int n, collective_kind kind, int32_t root) const {
  if (kind == collective_kind::broadcast) return tree_wire(1, rank, n, kind, root);
  plan p;
  if (n > 1) {
    p.release_to.push_back((rank + n - 1) % n);  // we read rank-1's buffers
    p.readers = 1;                               // rank+1 reads ours
  }
  return p;
}

std::unique_ptr<bucket_op> ring_allreduce::make(link& l, int32_t bucket, int64_t begin,
                                                int64_t end) const {
  if (l.kind == collective_kind::broadcast || l.n == 1)
    return make_tree_op(1, l, bucket, begin, end);
  return std::make_unique<ring_op>(l, bucket, begin, end);
}

}  // namespace troupe::reducers
