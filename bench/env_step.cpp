// Environment stepping cost: nanoseconds per instance step of a batch of M
// environments (random actions, auto-reset included), for each built-in
// environment, then for the example native plugin's CartPole-v1
// (examples/plugins, rl.env {"kind": "plugin"}; "plugin:CartPole-v1") when
// the build's plugin directory has it. Prints one JSON line per
// (environment, M).
//
// bench_env_step [steps=200000] [sizes=1,16,256]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_sizes.hpp"
#include "envs/env.hpp"
#include "envs/plugin_env.hpp"
#include "models/random.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  long total = 200000;
  std::vector<int64_t> sizes = {1, 16, 256};
  try {
    if (argc > 1) total = std::stol(argv[1]);
    if (argc > 2) {
      sizes.clear();
      for (const auto& item : bench::split_list(argv[2])) sizes.push_back(std::stoll(item));
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "bad value: usage bench_env_step [steps=200000] [sizes=1,16,256]\n");
    return 2;
  }
  if (total < 1) {
    std::fprintf(stderr, "bad value for steps: expected an integer >= 1\n");
    return 2;
  }
  for (int64_t m : sizes)
    if (m < 1) {
      std::fprintf(stderr, "bad value in sizes: expected integers >= 1\n");
      return 2;
    }
  // Each environment by its printed name; a plugin's by "plugin:<id>".
  std::vector<std::pair<std::string, std::function<std::unique_ptr<envs::vector_env>(int64_t)>>>
      kinds;
  for (const auto& name : envs::registered_envs())
    kinds.emplace_back(name, [name](int64_t m) { return envs::make_env(name, m); });
  const plugin_env_config example{"libtroupe_classic_plugin.so", "CartPole-v1", "{}"};
  if (envs::plugin_library_path(example.library) != example.library)  // found in the build
    kinds.emplace_back("plugin:CartPole-v1",
                       [example](int64_t m) { return envs::make_plugin_env(example, m); });
  for (const auto& [name, make] : kinds) {
    for (int64_t m : sizes) {
      auto e = make(m);
      const auto n = static_cast<std::size_t>(m);
      const auto obs_n = static_cast<std::size_t>(e->spec().observation_size);
      std::vector<float> obs(n * obs_n), final_obs(n * obs_n), reward(n);
      std::vector<uint8_t> term(n), trunc(n);
      std::vector<double> ret(n);
      std::vector<int64_t> len(n);
      envs::step_output out{obs.data(),       reward.data(), term.data(), trunc.data(),
                            final_obs.data(), ret.data(),    len.data()};
      e->reset(1, obs.data());
      splitmix64 rng(7);
      const long batches = std::max<long>(1, total / static_cast<long>(m));
      const auto& spec = e->spec();
      const auto dims = static_cast<std::size_t>(spec.action_dims());
      // 64 batches of random actions: discrete ones, or Box rows in bounds.
      std::vector<std::vector<int32_t>> actions(64, std::vector<int32_t>(n));
      std::vector<std::vector<float>> box(64, std::vector<float>(n * dims));
      for (auto& a : actions)
        for (auto& x : a)
          x = spec.continuous() ? 0 : static_cast<int32_t>(rng.next() % spec.actions);
      for (auto& a : box)
        for (std::size_t k = 0; k < a.size(); ++k)
          a[k] = spec.action_low[k % dims] +
                 static_cast<float>(rng.uniform()) *
                     (spec.action_high[k % dims] - spec.action_low[k % dims]);
      int64_t episodes = 0;
      auto t0 = std::chrono::steady_clock::now();
      for (long b = 0; b < batches; ++b) {
        const auto k = static_cast<std::size_t>(b % 64);
        if (spec.continuous())
          e->step_box(box[k].data(), out);
        else
          e->step(actions[k].data(), out);
        for (auto t : term) episodes += t;
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double steps = static_cast<double>(batches) * static_cast<double>(m);
      std::printf("%s\n", nlohmann::json{{"bench", "env_step"},
                                         {"env", name},
                                         {"instances", m},
                                         {"instance_steps", steps},
                                         {"ns_per_instance_step", s * 1e9 / steps},
                                         {"instance_steps_per_second", steps / s},
                                         {"episodes_terminated", episodes}}
                              .dump()
                              .c_str());
    }
  }
  return 0;
}
