#pragma once
// What the environment tests share: output buffers for a batch step, and a
// simulator state read back and compared.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "envs/env.hpp"

namespace troupe::envs::testing {

struct buffers {
  int64_t m, obs_n;
  std::vector<float> obs, reward, final_obs;
  std::vector<uint8_t> terminated, truncated;
  std::vector<double> ret;
  std::vector<int64_t> len;
  explicit buffers(const vector_env& e)
      : m(e.size()),
        obs_n(e.spec().observation_size),
        obs(static_cast<std::size_t>(m * obs_n)),
        reward(static_cast<std::size_t>(m)),
        final_obs(static_cast<std::size_t>(m * obs_n)),
        terminated(static_cast<std::size_t>(m)),
        truncated(static_cast<std::size_t>(m)),
        ret(static_cast<std::size_t>(m)),
        len(static_cast<std::size_t>(m)) {}
  step_output out() {
    return {obs.data(),       reward.data(), terminated.data(), truncated.data(),
            final_obs.data(), ret.data(),    len.data()};
  }
};

// A Python that imports `modules` ("gymnasium" or "gymnasium, ale_py"):
// $TROUPE_GYM_PYTHON, else $TROUPE_VENV's, else the venv
// scripts/install-deps.sh makes; "" when this host has none (the case skips).
inline std::string python_with(const std::string& modules) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("TROUPE_GYM_PYTHON")) candidates.emplace_back(p);
  if (const char* venv = std::getenv("TROUPE_VENV"))
    candidates.push_back(std::string(venv) + "/bin/python");
  if (const char* home = std::getenv("HOME"))
    candidates.push_back(std::string(home) + "/.cache/troupe-venv/bin/python");
  for (const auto& p : candidates)
    if (std::system(("'" + p + "' -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0)
      return p;
  return "";
}

inline std::vector<double> state_of(const vector_env& e, int64_t i) {
  std::vector<double> s(static_cast<std::size_t>(e.state_size()));
  e.get_state(i, s.data());
  return s;
}

inline void check_close(const std::vector<double>& got, const std::vector<double>& want,
                        double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t c = 0; c < got.size(); ++c) {
    CAPTURE(c);
    CHECK(std::abs(got[c] - want[c]) <= tol * std::max(1.0, std::abs(want[c])));
  }
}

}  // namespace troupe::envs::testing
