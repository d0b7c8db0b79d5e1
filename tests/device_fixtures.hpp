#pragma once
// Shared by the device tests: threads standing in for device threads, the
// optimizer's slots in a device's memory, and the main of the GPU tests
// (label gpu), which skip with the reason where no GPU is visible.
#include <doctest/doctest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "devices/device.hpp"
#include "devices/device_context.hpp"
#include "models/model.hpp"
#include "tests/skip.hpp"

namespace troupe::test {

// Runs f(rank) on n threads; returns each rank's exception message ("" if none).
inline std::vector<std::string> on_ranks(int n, const std::function<void(int)>& f) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// `kinds` zeroed optimizer slots per variable of `m`, in ctx's memory, and
// their pointers as optimizer::apply_on takes them.
struct device_slots {
  std::vector<std::vector<device_buffer>> buffers;
  std::vector<std::vector<float*>> ptrs;
  device_slots(device_context& ctx, model& m, std::size_t kinds) : buffers(kinds), ptrs(kinds) {
    for (std::size_t k = 0; k < kinds; ++k)
      for (auto& v : m.variables()) {
        buffers[k].push_back(ctx.allocate(v.value.nbytes()));
        ctx.ops().fill(buffers[k].back().f32(), 0.0f, static_cast<std::size_t>(v.value.numel()));
        ptrs[k].push_back(buffers[k].back().f32());
      }
  }
};

// The main of a GPU test: exit 77 (ctest: skipped) with the reason when no
// CUDA device is visible, else doctest.
inline int gpu_test_main(int argc, char** argv) {
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::printf("SKIPPED: no CUDA device: %s\n", why.c_str());
    return 77;
  }
  return run_cases(argc, argv);
}

}  // namespace troupe::test
