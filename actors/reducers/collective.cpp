#include "actors/reducers/collective.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/cpu_kernels.hpp"

namespace troupe::reducers {

flat_view::flat_view(std::vector<tensor> ts) : tensors(std::move(ts)) {
  data.reserve(tensors.size());
  offsets.reserve(tensors.size() + 1);
  offsets.push_back(0);
  for (auto& t : tensors) {
    bool usable = t.type() == dtype::f32 && !t.empty();
    data.push_back(usable ? static_cast<float*>(t.raw()) : nullptr);
    offsets.push_back(offsets.back() + t.numel());
  }
}

std::size_t flat_view::first_tensor(int64_t a) const {
  // The last tensor starting at or before a (skipping empty ones is done by
  // for_pieces, which ignores zero-length pieces).
  auto it = std::upper_bound(offsets.begin(), offsets.end() - 1, a);
  return static_cast<std::size_t>(it - offsets.begin()) - 1;
}

namespace {
std::string call_name(const posted& p) {
  switch (p.kind) {
    case collective_kind::allreduce:
      return std::string("allreduce(") + reduce_op_name(p.op) + ")";
    case collective_kind::reduce_scatter:
      return std::string("reduce_scatter(") + reduce_op_name(p.op) + ")";
    case collective_kind::all_gather:
      return "all_gather";
    case collective_kind::broadcast:
      break;
  }
  return "broadcast(root " + std::to_string(p.root) + ")";
}
}  // namespace

std::string compare_posted(int rank_a, const posted& a, int rank_b, const posted& b) {
  // The common case (everything matches) builds no strings.
  auto ra = [&] { return "rank " + std::to_string(rank_a); };
  auto rb = [&] { return "rank " + std::to_string(rank_b); };
  auto head = [&] { return "collective #" + std::to_string(a.seq) + ": "; };
  bool reduces = a.kind == collective_kind::allreduce || a.kind == collective_kind::reduce_scatter;
  if (a.kind != b.kind || (reduces && a.op != b.op) ||
      (a.kind == collective_kind::broadcast && a.root != b.root))
    return head() + ra() + " called " + call_name(a) + ", " + rb() + " called " + call_name(b);
  const auto& ta = a.view.tensors;
  const auto& tb = b.view.tensors;
  if (ta.size() != tb.size())
    return head() + ra() + " passed " + std::to_string(ta.size()) + " tensors, " + rb() +
           " passed " + std::to_string(tb.size());
  for (std::size_t i = 0; i < ta.size(); ++i)
    if (ta[i].shape() != tb[i].shape() || ta[i].type() != tb[i].type())
      return head() + "tensor " + std::to_string(i) + " is " + dtype_name(ta[i].type()) +
             shape_string(ta[i].shape()) + " on " + ra() + " but " + dtype_name(tb[i].type()) +
             shape_string(tb[i].shape()) + " on " + rb();
  return {};
}

// --- kernels (the dispatched vector loops of kernels/cpu_kernels.hpp) ---

void combine(float* acc, const float* x, int64_t n, reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::mean:
      kernels::add_inplace(acc, x, static_cast<std::size_t>(n));
      break;
    case reduce_op::min:
      kernels::min_inplace(acc, x, static_cast<std::size_t>(n));
      break;
    case reduce_op::max:
      kernels::max_inplace(acc, x, static_cast<std::size_t>(n));
      break;
  }
}

void combine_final(float* acc, const float* x, int64_t n, reduce_op op, float scale) {
  // (acc + x) * scale: the sum rounded, then the product, as one loop would.
  combine(acc, x, n, op);
  if (op == reduce_op::mean) kernels::scale_inplace(acc, scale, static_cast<std::size_t>(n));
}

void combine_many(float* acc, const float* const* xs, int m, int64_t n, reduce_op op, float scale) {
  constexpr int64_t block = 2048;  // 8 KiB of acc stays in L1 while the sources stream
  for (int64_t b = 0; b < n; b += block) {
    int64_t len = std::min(block, n - b);
    for (int k = 0; k < m; ++k) combine(acc + b, xs[k] + b, len, op);
    if (op == reduce_op::mean)
      kernels::scale_inplace(acc + b, scale, static_cast<std::size_t>(len));
  }
}

void copy_floats(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

std::vector<int64_t> split_range(int64_t begin, int64_t end, int64_t parts) {
  std::vector<int64_t> b(static_cast<std::size_t>(parts) + 1);
  int64_t len = end - begin;
  for (int64_t i = 0; i <= parts; ++i) {
    int64_t x = len * i / parts;
    if (i > 0 && i < parts && len >= 16 * parts) x = x / 16 * 16;
    b[static_cast<std::size_t>(i)] = begin + x;
  }
  return b;
}

}  // namespace troupe::reducers
