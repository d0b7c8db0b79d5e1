// sum_tree: draws follow exact proportional sampling (a chi-squared test on
// 1e5 draws with a fixed seed), updates and removals change the totals and
// the draws as they should, importance weights match their formula, and bad
// input is refused.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/sum_tree.hpp"
#include "models/random.hpp"

using namespace troupe;

namespace {

// Pearson's statistic of `draws` from `tree` against the expected
// probabilities `p` (which sum to 1).
double chi_squared(const sum_tree& tree, const std::vector<double>& p, int64_t draws,
                   uint64_t seed) {
  std::vector<int64_t> counts(p.size(), 0);
  splitmix64 rng(seed);
  for (int64_t k = 0; k < draws; ++k) ++counts[static_cast<std::size_t>(tree.find(rng.uniform()))];
  double stat = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] * static_cast<double>(draws);
    const double d = static_cast<double>(counts[i]) - expected;
    stat += d * d / expected;
  }
  return stat;
}

// 50 slots: 49 degrees of freedom; the chi-squared quantile at 0.999.
constexpr int64_t kSlots = 50;
constexpr double kCritical49 = 85.351;

std::vector<double> priorities(uint64_t seed) {
  splitmix64 rng(seed);
  std::vector<double> p(kSlots);
  for (auto& x : p) x = 0.05 + 3.0 * rng.uniform();
  return p;
}

// p_i^alpha / sum_j p_j^alpha.
std::vector<double> proportional(const std::vector<double>& p, double alpha) {
  std::vector<double> out(p.size());
  double sum = 0;
  for (std::size_t i = 0; i < p.size(); ++i) sum += out[i] = std::pow(p[i], alpha);
  for (auto& x : out) x /= sum;
  return out;
}

}  // namespace

TEST_CASE("sum_tree: 1e5 draws follow priority^alpha / sum (chi-squared, 49 dof)") {
  const auto p = priorities(7);
  for (double alpha : {1.0, 0.6}) {
    CAPTURE(alpha);
    sum_tree tree(kSlots, alpha);
    for (int64_t i = 0; i < kSlots; ++i) tree.set(i, p[static_cast<std::size_t>(i)]);
    const double stat = chi_squared(tree, proportional(p, alpha), 100000, 12345);
    CHECK(stat < kCritical49);
    // The test has power: the same draws judged against the wrong alpha's
    // probabilities fail it by far.
    const double wrong =
        chi_squared(tree, proportional(p, alpha == 1.0 ? 0.6 : 1.0), 100000, 12345);
    CHECK(wrong > 4 * kCritical49);
  }
}

TEST_CASE("sum_tree: a capacity that is not a power of two samples only its slots") {
  sum_tree tree(5, 1.0);
  const std::vector<double> p = {1, 2, 3, 4, 5};
  for (int64_t i = 0; i < 5; ++i) tree.set(i, p[static_cast<std::size_t>(i)]);
  CHECK(tree.total() == doctest::Approx(15));
  splitmix64 rng(3);
  std::vector<int64_t> counts(5, 0);
  for (int k = 0; k < 30000; ++k) ++counts[static_cast<std::size_t>(tree.find(rng.uniform()))];
  for (std::size_t i = 0; i < 5; ++i)
    CHECK(static_cast<double>(counts[i]) / 30000 == doctest::Approx(p[i] / 15).epsilon(0.06));
  // u at the very top of [0, 1) lands on the last non-empty slot.
  CHECK(tree.find(std::nextafter(1.0, 0.0)) == 4);
  CHECK(tree.find(0.0) == 0);
}

TEST_CASE("sum_tree: updates and removals keep the sums, and removed slots are never drawn") {
  sum_tree tree(8, 1.0);
  for (int64_t i = 0; i < 8; ++i) tree.set(i, 1.0);
  CHECK(tree.size() == 8);
  CHECK(tree.total() == doctest::Approx(8));
  tree.set(3, 5.0);
  CHECK(tree.total() == doctest::Approx(12));
  CHECK(tree.mass(3) == doctest::Approx(5));
  tree.remove(0);
  tree.remove(7);
  tree.remove(7);  // twice: still one fewer
  CHECK(tree.size() == 6);
  CHECK(tree.total() == doctest::Approx(10));
  splitmix64 rng(11);
  int64_t threes = 0;
  for (int k = 0; k < 20000; ++k) {
    const int64_t i = tree.find(rng.uniform());
    REQUIRE(i != 0);
    REQUIRE(i != 7);
    threes += i == 3;
  }
  CHECK(static_cast<double>(threes) / 20000 == doctest::Approx(0.5).epsilon(0.03));
  // Many updates leave no drift: the root equals a fresh sum of the leaves.
  for (int k = 0; k < 100000; ++k) tree.set(1 + k % 6, 0.1 + rng.uniform());
  double sum = 0;
  for (int64_t i = 0; i < 8; ++i) sum += tree.mass(i);
  CHECK(tree.total() == sum);
  for (int64_t i = 0; i < 8; ++i) tree.remove(i);
  CHECK(tree.size() == 0);
  CHECK(tree.total() == 0);
  CHECK_THROWS_AS(tree.find(0.5), std::logic_error);
}

TEST_CASE("sum_tree: importance weights are (N P(i))^-beta over their maximum") {
  sum_tree tree(4, 0.5);
  const std::vector<double> p = {1, 4, 9, 16};  // masses 1, 2, 3, 4 under alpha 0.5
  for (int64_t i = 0; i < 4; ++i) tree.set(i, p[static_cast<std::size_t>(i)]);
  CHECK(tree.min_mass() == doctest::Approx(1));
  const double beta = 0.4;
  std::vector<double> w(4);
  double wmax = 0;
  for (int64_t i = 0; i < 4; ++i) {
    const double P = tree.mass(i) / tree.total();
    w[static_cast<std::size_t>(i)] = std::pow(4 * P, -beta);
    wmax = std::max(wmax, w[static_cast<std::size_t>(i)]);
  }
  for (int64_t i = 0; i < 4; ++i)
    CHECK(tree.weight(i, beta) == doctest::Approx(w[static_cast<std::size_t>(i)] / wmax));
  CHECK(tree.weight(0, beta) == doctest::Approx(1));
  // Removing the smallest changes the normaliser.
  tree.remove(0);
  CHECK(tree.min_mass() == doctest::Approx(2));
  CHECK(tree.weight(1, beta) == doctest::Approx(1));
  CHECK(tree.weight(0, beta) == 0);
}

TEST_CASE("sum_tree: bad input is refused with what and where") {
  CHECK_THROWS_AS(sum_tree(0), std::invalid_argument);
  CHECK_THROWS_AS(sum_tree(4, -1.0), std::invalid_argument);
  sum_tree tree(4);
  CHECK_THROWS_AS(tree.set(4, 1.0), std::out_of_range);
  CHECK_THROWS_AS(tree.set(-1, 1.0), std::out_of_range);
  CHECK_THROWS_AS(tree.set(0, -1.0), std::invalid_argument);
  CHECK_THROWS_AS(tree.set(0, std::nan("")), std::invalid_argument);
  CHECK_THROWS_WITH(tree.set(2, INFINITY), doctest::Contains("slot 2"));
  // alpha 0: uniform among the non-empty slots, empty ones stay empty.
  sum_tree uniform(4, 0.0);
  uniform.set(0, 5.0);
  uniform.set(1, 0.0);
  uniform.set(2, 0.01);
  CHECK(uniform.size() == 2);
  CHECK(uniform.total() == doctest::Approx(2));
}
