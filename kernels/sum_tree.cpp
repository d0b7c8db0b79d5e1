#include "kernels/sum_tree.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace troupe {
namespace {

constexpr double kEmpty = std::numeric_limits<double>::infinity();  // in the min tree

int64_t leaves_for(int64_t capacity) {
  int64_t n = 1;
  while (n < capacity) n *= 2;
  return n;
}

}  // namespace

sum_tree::sum_tree(int64_t capacity, double alpha)
    : capacity_(capacity), leaves_(leaves_for(capacity)), alpha_(alpha) {
  if (capacity < 1)
    throw std::invalid_argument("sum_tree: capacity must be at least 1, got " +
                                std::to_string(capacity));
  if (!(alpha >= 0) || !std::isfinite(alpha))
    throw std::invalid_argument("sum_tree: alpha must be finite and >= 0, got " +
                                std::to_string(alpha));
  nodes_.assign(static_cast<std::size_t>(2 * leaves_), 0.0);
  min_.assign(static_cast<std::size_t>(2 * leaves_), kEmpty);
}

void sum_tree::set(int64_t i, double priority) {
  if (i < 0 || i >= capacity_)
    throw std::out_of_range("sum_tree: slot " + std::to_string(i) + " outside [0, " +
                            std::to_string(capacity_) + ")");
  if (!(priority >= 0) || !std::isfinite(priority))
    throw std::invalid_argument("sum_tree: priority of slot " + std::to_string(i) +
                                " must be finite and >= 0, got " + std::to_string(priority));
  // alpha 0 with priority 0 would give 0^0 = 1: an empty slot stays empty.
  const double m = priority > 0 ? std::pow(priority, alpha_) : 0.0;
  auto node = static_cast<std::size_t>(leaves_ + i);
  filled_ += (m > 0 ? 1 : 0) - (nodes_[node] > 0 ? 1 : 0);
  nodes_[node] = m;
  min_[node] = m > 0 ? m : kEmpty;
  // Each parent is recomputed from its children, not adjusted by a delta:
  // no rounding drift accumulates over millions of updates.
  for (node /= 2; node >= 1; node /= 2) {
    nodes_[node] = nodes_[2 * node] + nodes_[2 * node + 1];
    min_[node] = std::min(min_[2 * node], min_[2 * node + 1]);
  }
}

double sum_tree::mass(int64_t i) const {
  if (i < 0 || i >= capacity_)
    throw std::out_of_range("sum_tree: slot " + std::to_string(i) + " outside [0, " +
                            std::to_string(capacity_) + ")");
  return nodes_[static_cast<std::size_t>(leaves_ + i)];
}

double sum_tree::min_mass() const {
  return filled_ > 0 ? min_[1] : 0.0;
}

int64_t sum_tree::find(double u) const {
  if (filled_ == 0) throw std::logic_error("sum_tree: sampling from an empty tree");
  double target = u * total();
  std::size_t node = 1;
  while (node < static_cast<std::size_t>(leaves_)) {
    const double left = nodes_[2 * node];
    // Rounding may put target at or past the total: never step into an
    // empty subtree, so the leaf reached always has a mass.
    if ((target < left && left > 0) || nodes_[2 * node + 1] <= 0) {
      node = 2 * node;
    } else {
      target -= left;
      node = 2 * node + 1;
    }
  }
  return static_cast<int64_t>(node) - leaves_;
}

double sum_tree::weight(int64_t i, double beta) const {
  const double m = mass(i);
  if (m <= 0) return 0;
  // (N P(i))^-beta / (N P_min)^-beta = (P_min / P(i))^beta = (m_min / m)^beta.
  return std::pow(min_mass() / m, beta);
}

}  // namespace troupe
