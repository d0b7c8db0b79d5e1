#pragma once
// Shared by test_remote_ring and its child process (remote_ring_peer): the
// inputs of each rank, the script of collectives both run, a hash of results.
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "messages/messages.hpp"

namespace troupe::ring_test {

// Rank `rank`'s input of collective `iter`: `numel` floats in up to 3 tensors
// of uneven sizes, small multiples of 1/4 (sums are exact in float).
inline std::vector<tensor> inputs(int rank, int iter, int64_t numel) {
  std::vector<int64_t> sizes;
  if (numel >= 3) {
    sizes = {numel / 3 + 1, numel / 5, numel - (numel / 3 + 1) - numel / 5};
  } else {
    sizes = {numel};
  }
  std::vector<tensor> ts;
  int64_t k = 0;
  for (auto s : sizes) {
    tensor t(shape_t{s});
    float* p = t.f32();
    for (int64_t i = 0; i < s; ++i, ++k)
      p[i] = static_cast<float>((rank * 7 + iter * 13 + k * 31) % 41 - 20) * 0.25f;
    ts.push_back(std::move(t));
  }
  return ts;
}

// The reference result over `ranks` ranks, flattened.
inline std::vector<float> reference(int ranks, int iter, int64_t numel, reduce_op op) {
  std::vector<float> acc;
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> x;
    for (auto& t : inputs(r, iter, numel)) x.insert(x.end(), t.f32(), t.f32() + t.numel());
    if (r == 0) {
      acc = x;
      continue;
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (op == reduce_op::min)
        acc[i] = x[i] < acc[i] ? x[i] : acc[i];
      else if (op == reduce_op::max)
        acc[i] = x[i] > acc[i] ? x[i] : acc[i];
      else
        acc[i] += x[i];
    }
  }
  if (op == reduce_op::mean)
    for (auto& v : acc) v *= 1.0f / static_cast<float>(ranks);
  return acc;
}

inline std::vector<float> flatten(const std::vector<tensor>& ts) {
  std::vector<float> r;
  for (auto& t : ts) r.insert(r.end(), t.f32(), t.f32() + t.numel());
  return r;
}

inline uint64_t hash(const std::vector<tensor>& ts) {
  uint64_t h = 1469598103934665603ull;
  for (auto& t : ts) {
    auto* b = static_cast<const unsigned char*>(t.raw());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

// The collectives of the 2-process check, in order: (elements, op).
inline std::vector<std::pair<int64_t, reduce_op>> script() {
  return {{1, reduce_op::sum},      {17, reduce_op::mean},    {1000003, reduce_op::sum},
          {262147, reduce_op::min}, {262147, reduce_op::max}, {3000001, reduce_op::mean},
          {0, reduce_op::sum},      {5, reduce_op::max}};
}

}  // namespace troupe::ring_test
