#pragma once
// Sizes and iteration counts shared by the all-reduce benchmarks
// (bench/allreduce.cpp, i.e. `troupe bench allreduce`, and the MPI yardstick
// bench/mpi_allreduce.cpp), so that their rows compare one to one.
// Header-only and free of CAF: the MPI program links nothing of troupe's.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::bench {

// "8", "64K", "16M", "1G" (also KB/KiB, MB/MiB, GB/GiB): bytes, > 0.
// Throws std::invalid_argument naming the text.
inline int64_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  long long v = std::stoll(s, &pos);
  std::string unit = s.substr(pos);
  int64_t mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else if (unit == "K" || unit == "k" || unit == "KB" || unit == "KiB") {
    mult = int64_t{1} << 10;
  } else if (unit == "M" || unit == "MB" || unit == "MiB") {
    mult = int64_t{1} << 20;
  } else if (unit == "G" || unit == "GB" || unit == "GiB") {
    mult = int64_t{1} << 30;
  } else {
    throw std::invalid_argument("bad size '" + s + "' (examples: 8, 64K, 16M, 1G)");
  }
  if (v <= 0) throw std::invalid_argument("size '" + s + "' must be positive");
  return v * mult;
}

// "a,b,,c" -> {"a", "b", "c"}
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> r;
  std::size_t a = 0;
  while (a <= s.size()) {
    auto b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) r.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return r;
}

// Iterations for a size when none are given: about 1 GB of payload, 20 to 1000.
inline int64_t default_iterations(int64_t bytes) {
  return std::clamp<int64_t>((int64_t{1} << 30) / std::max<int64_t>(1, bytes), 20, 1000);
}

}  // namespace troupe::bench
