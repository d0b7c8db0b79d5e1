#pragma once
// sum_tree: prioritized sampling for replay (Schaul et al. 2016, "Prioritized
// Experience Replay"; Horgan et al. 2018, Ape-X). A complete binary tree over
// `capacity` slots whose inner nodes hold the sum of their children, so that
// drawing slot i with probability p_i^alpha / sum_j p_j^alpha, and changing
// one priority, each cost O(log capacity) instead of a scan over the buffer.
// The tree stores p^alpha: alpha is applied once, on the way in.
#include <cstdint>
#include <vector>

namespace troupe {

class sum_tree {
 public:
  // `capacity` slots (>= 1), all empty (priority 0, never drawn).
  // alpha >= 0: 0 samples uniformly among non-empty slots, 1 proportionally.
  explicit sum_tree(int64_t capacity, double alpha = 1.0);

  int64_t capacity() const { return capacity_; }
  double alpha() const { return alpha_; }

  // Sets slot i's priority (>= 0, finite; 0 empties the slot). Throws
  // std::out_of_range for a slot outside [0, capacity) and
  // std::invalid_argument for a negative or non-finite priority.
  void set(int64_t i, double priority);
  // Empties slot i (it is never drawn until set again).
  void remove(int64_t i) { set(i, 0.0); }

  // Slot i's stored mass, priority^alpha.
  double mass(int64_t i) const;
  // The sum of every slot's mass.
  double total() const { return nodes_.empty() ? 0 : nodes_[1]; }
  // The smallest non-zero mass (0 when every slot is empty): the largest
  // importance weight, by which the others are normalised.
  double min_mass() const;
  // Slots with a non-zero mass.
  int64_t size() const { return filled_; }

  // The slot whose cumulative-mass interval holds u * total() (u in [0, 1)):
  // drawn with probability mass / total. Throws std::logic_error when the
  // tree is empty.
  int64_t find(double u) const;

  // Importance-sampling weight of slot i under beta, normalised by the
  // largest weight: (N * P(i))^-beta / max_j (N * P(j))^-beta, with N the
  // non-empty slots. In (0, 1]; corrects the bias of non-uniform sampling.
  double weight(int64_t i, double beta) const;

 private:
  int64_t capacity_;
  int64_t leaves_;  // a power of two >= capacity: leaf i is node leaves_ + i
  double alpha_;
  int64_t filled_ = 0;
  std::vector<double> nodes_;  // sums, 1-based heap layout; [0] unused
  std::vector<double> min_;    // minimum non-zero mass below each node (inf: none)
};

}  // namespace troupe
