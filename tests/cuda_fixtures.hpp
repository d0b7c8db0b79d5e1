#pragma once
// Shared by the CUDA backend's tests (test_cuda, test_cuda_layers): a
// context on cuda:0 with uploads and downloads, and the comparison of the
// GPU's results with the CPU backend's. Only in targets built with the CUDA
// path (TROUPE_HAVE_CUDA).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "devices/cuda_context.hpp"
#include "devices/device_context.hpp"
#include "kernels/backend.hpp"

namespace troupe::test {

// A context on cuda:0, made on this thread (the test's thread is the device's).
struct gpu_fixture {
  std::shared_ptr<device_context> ctx =
      make_cuda_context(device_spec{device_spec::kind_t::cuda, 0});
  kernels::backend& gpu = ctx->ops();
  kernels::backend& cpu = kernels::cpu_backend();

  template <class T>
  device_buffer upload(const std::vector<T>& v) {
    auto b = ctx->allocate(std::max<std::size_t>(v.size() * sizeof(T), 1));
    if (!v.empty()) ctx->copy_to_device(b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }
  // A device output of n floats, NaN until written.
  device_buffer output(std::size_t n) {
    return upload(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
  }
  template <class T>
  std::vector<T> download(const device_buffer& b, std::size_t n) {
    std::vector<T> v(n);
    if (n) ctx->copy_to_host(v.data(), b.data(), n * sizeof(T));
    return v;
  }
  std::vector<float> download(const device_buffer& b, std::size_t n) {
    return download<float>(b, n);
  }
};

// "" when every |got - want| <= rel * (1 + |want|) (NaN only where want is
// NaN), else the worst element.
inline std::string mismatch(const std::vector<float>& got, const std::vector<float>& want,
                            double rel) {
  if (got.size() != want.size())
    return "sizes " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g))
        return "NaN mismatch at " + std::to_string(i) + ": gpu " + std::to_string(got[i]) +
               ", cpu " + std::to_string(want[i]);
      continue;
    }
    const double err = std::fabs(g - w) / (1.0 + std::fabs(w));
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  if (worst <= rel) return "";
  return "element " + std::to_string(at) + ": gpu " + std::to_string(got[at]) + ", cpu " +
         std::to_string(want[at]) + " (relative error " + std::to_string(worst) + ")";
}

}  // namespace troupe::test

#define CHECK_CLOSE(got, want, rel)                                  \
  do {                                                               \
    const std::string m_ = ::troupe::test::mismatch(got, want, rel); \
    INFO(#got " vs " #want ": " << m_);                              \
    CHECK(m_.empty());                                               \
  } while (0)
