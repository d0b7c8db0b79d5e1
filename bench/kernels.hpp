#pragma once
// `troupe bench kernels` (bench/kernels.cpp): the CPU kernels' rates.
#include <ostream>
#include <string>
#include <vector>

namespace troupe {

// [--seconds S] [--json]: every dense product of the examples' MLP (oneDNN,
// at the active level) in GFLOP/s against the core's estimated peak, the
// Fashion-MNIST convnet's convolutions (forward, backward; batch 128) in
// ms and GFLOP/s and its batch norm, relu and max pooling in ms, then
// troupe's own loops (Adam, the fused activation backward + bias gradient,
// softmax-CE, the reducers' sums, ...) in GB/s at every instruction-set level
// this CPU supports. One thread. Returns the process exit status (2 on bad
// usage).
int run_kernels_bench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace troupe
