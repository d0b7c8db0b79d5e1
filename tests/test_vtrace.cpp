// V-trace against the paper's definition written as a sum (not the
// recursion the kernel uses), on-policy n-step returns, and episode ends
// inside an unroll: termination stops the return, truncation bootstraps from
// the final observation's value and cuts the trace, as two separate unrolls
// would.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/vtrace.hpp"
#include "models/random.hpp"

using namespace troupe;
using kernels::vtrace;
using kernels::vtrace_input;

namespace {

struct unroll {
  int64_t T, B;
  std::vector<float> log_rhos, rewards, values, next_values, discounts;
  std::vector<uint8_t> continues;
  unroll(int64_t t, int64_t b, uint64_t seed, double gamma) : T(t), B(b) {
    const auto n = static_cast<std::size_t>(T * B);
    splitmix64 g(seed);
    log_rhos.resize(n);
    rewards.resize(n);
    values.resize(n);
    next_values.resize(n);
    discounts.assign(n, static_cast<float>(gamma));
    continues.assign(n, 1);
    for (std::size_t i = 0; i < n; ++i) {
      log_rhos[i] = static_cast<float>(g.uniform() * 2 - 1);
      rewards[i] = static_cast<float>(g.uniform() * 2 - 1);
      values[i] = static_cast<float>(g.uniform() * 4 - 2);
    }
    // No episode end: next value is the next step's, the bootstrap at the end.
    for (int64_t b2 = 0; b2 < B; ++b2) {
      for (int64_t s = 0; s + 1 < T; ++s) next_values[at(s, b2)] = values[at(s + 1, b2)];
      next_values[at(T - 1, b2)] = static_cast<float>(g.uniform() * 4 - 2);
      continues[at(T - 1, b2)] = 0;
    }
  }
  std::size_t at(int64_t t, int64_t b) const { return static_cast<std::size_t>(t * B + b); }
  vtrace_input input(double rho_bar = 1, double c_bar = 1, double pg_rho_bar = 1) const {
    vtrace_input in;
    in.T = T;
    in.B = B;
    in.log_rhos = log_rhos.data();
    in.rewards = rewards.data();
    in.values = values.data();
    in.next_values = next_values.data();
    in.discounts = discounts.data();
    in.continues = continues.data();
    in.rho_bar = rho_bar;
    in.c_bar = c_bar;
    in.pg_rho_bar = pg_rho_bar;
    return in;
  }
};

}  // namespace

TEST_CASE("V-trace targets equal the paper's sum definition (no episode end)") {
  const double gamma = 0.97, rho_bar = 1.0, c_bar = 0.9;
  unroll u(7, 3, 11, gamma);
  auto out = vtrace(u.input(rho_bar, c_bar, 1.0));
  for (int64_t b = 0; b < u.B; ++b)
    for (int64_t t = 0; t < u.T; ++t) {
      // vs_t = V(x_t) + sum_{s>=t} gamma^{s-t} (prod_{t<=i<s} c_i) delta_s
      double sum = 0, weight = 1;
      for (int64_t s = t; s < u.T; ++s) {
        const double rho = std::exp(double(u.log_rhos[u.at(s, b)]));
        const double delta =
            std::min(rho_bar, rho) *
            (u.rewards[u.at(s, b)] + gamma * u.next_values[u.at(s, b)] - u.values[u.at(s, b)]);
        sum += weight * delta;
        weight *= gamma * std::min(c_bar, rho);
      }
      CAPTURE(t);
      CHECK(out.vs[u.at(t, b)] == doctest::Approx(u.values[u.at(t, b)] + sum).epsilon(1e-5));
      // Advantage: rho^pg (r_t + gamma vs_{t+1} - V(x_t)), vs_T = bootstrap.
      const double vs_next =
          t + 1 < u.T ? double(out.vs[u.at(t + 1, b)]) : double(u.next_values[u.at(t, b)]);
      const double rho = std::exp(double(u.log_rhos[u.at(t, b)]));
      CHECK(out.pg_advantages[u.at(t, b)] ==
            doctest::Approx(std::min(1.0, rho) *
                            (u.rewards[u.at(t, b)] + gamma * vs_next - u.values[u.at(t, b)]))
                .epsilon(1e-5));
    }
}

TEST_CASE("on-policy V-trace is the n-step return with the bootstrap") {
  const double gamma = 0.9;
  unroll u(5, 2, 3, gamma);
  std::fill(u.log_rhos.begin(), u.log_rhos.end(), 0.0f);
  auto out = vtrace(u.input());
  for (int64_t b = 0; b < u.B; ++b)
    for (int64_t t = 0; t < u.T; ++t) {
      double ret = 0, g = 1;
      for (int64_t s = t; s < u.T; ++s, g *= gamma) ret += g * u.rewards[u.at(s, b)];
      ret += g * u.next_values[u.at(u.T - 1, b)];
      CHECK(out.vs[u.at(t, b)] == doctest::Approx(ret).epsilon(1e-5));
    }
}

TEST_CASE("termination stops the return; truncation bootstraps and cuts the trace") {
  const double gamma = 0.95;
  unroll u(8, 1, 5, gamma);
  const int64_t k = 3;  // the episode ends at step 3; step 4 starts a new one
  SUBCASE("terminated at k: no value after it, nothing from the next episode") {
    u.discounts[u.at(k, 0)] = 0;
    u.continues[u.at(k, 0)] = 0;
    std::fill(u.log_rhos.begin(), u.log_rhos.end(), 0.0f);
    auto out = vtrace(u.input());
    CHECK(out.vs[u.at(k, 0)] == doctest::Approx(u.rewards[u.at(k, 0)]));
    double ret = 0, g = 1;
    for (int64_t s = 0; s <= k; ++s, g *= gamma) ret += g * u.rewards[u.at(s, 0)];
    CHECK(out.vs[0] == doctest::Approx(ret).epsilon(1e-5));
    CHECK(out.pg_advantages[u.at(k, 0)] ==
          doctest::Approx(u.rewards[u.at(k, 0)] - u.values[u.at(k, 0)]).epsilon(1e-5));
  }
  SUBCASE("truncated at k: the same as two unrolls, the first bootstrapping from V(final)") {
    const float v_final = 1.25f;
    u.next_values[u.at(k, 0)] = v_final;
    u.continues[u.at(k, 0)] = 0;
    auto whole = vtrace(u.input(1.0, 1.0, 1.0));
    // The two pieces on their own.
    unroll first = u, second = u;
    first.T = k + 1;
    second.T = u.T - k - 1;
    for (auto* v : {&second.log_rhos, &second.rewards, &second.values, &second.next_values,
                    &second.discounts})
      v->erase(v->begin(), v->begin() + k + 1);
    second.continues.erase(second.continues.begin(), second.continues.begin() + k + 1);
    auto a = vtrace(first.input(1.0, 1.0, 1.0));
    auto b = vtrace(second.input(1.0, 1.0, 1.0));
    for (int64_t t = 0; t <= k; ++t) {
      CHECK(whole.vs[u.at(t, 0)] == a.vs[static_cast<std::size_t>(t)]);
      CHECK(whole.pg_advantages[u.at(t, 0)] == a.pg_advantages[static_cast<std::size_t>(t)]);
    }
    for (int64_t t = k + 1; t < u.T; ++t) {
      CHECK(whole.vs[u.at(t, 0)] == b.vs[static_cast<std::size_t>(t - k - 1)]);
      CHECK(whole.pg_advantages[u.at(t, 0)] ==
            b.pg_advantages[static_cast<std::size_t>(t - k - 1)]);
    }
  }
}

TEST_CASE("V-trace: bad input is refused") {
  unroll u(2, 1, 1, 0.9);
  auto in = u.input();
  in.rho_bar = 0;
  CHECK_THROWS_WITH_AS(vtrace(in), "vtrace: clip thresholds must be > 0", std::invalid_argument);
  in = u.input();
  in.values = nullptr;
  CHECK_THROWS_WITH_AS(vtrace(in), "vtrace: an input is missing", std::invalid_argument);
  in = u.input();
  in.T = -1;
  CHECK_THROWS_AS(vtrace(in), std::invalid_argument);
  in = u.input();
  in.T = 0;
  CHECK(vtrace(in).vs.empty());
}
