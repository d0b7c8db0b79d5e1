#pragma once
// A portable, seeded PRNG (splitmix64): the same seed gives the same numbers on
// every platform and standard library, which std::*_distribution does not.
#include <cmath>
#include <cstdint>

namespace troupe {

class splitmix64 {
 public:
  explicit splitmix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller.
  double normal() {
    double u1 = uniform();
    double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// A seed for a sub-stream (layer, replica, epoch) derived from a job seed.
inline uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  splitmix64 g(seed ^ (0xD1B54A32D192ED03ULL * (stream + 1)));
  return g.next();
}

}  // namespace troupe
