#pragma once
// Tensor-level optimizer used by the replicas: owns the slot tensors
// (momentum / Adam moments / RMSprop mean square) of a fixed list of
// variables and applies one update per apply() with the scheduled learning
// rate (kernels/lr_schedule.hpp).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/job_config.hpp"
#include "kernels/backend.hpp"
#include "messages/tensor.hpp"

namespace troupe::kernels {

class optimizer {
 public:
  // Throws std::invalid_argument for a kind other than sgd, momentum, adam,
  // rmsprop (or an unknown schedule kind).
  optimizer(troupe::optimizer_config cfg, int64_t total_steps);

  // Creates zeroed slots for these variables (same order as later apply
  // calls). Variables must be float32. Calling it again starts afresh.
  void init(const std::vector<troupe::named_tensor>& vars);

  // One update of every variable with its gradient (grads[i] belongs to
  // vars[i]); throws std::invalid_argument on count/shape/name/type mismatch,
  // before changing anything. Increments step(). Calls init() on first use
  // when it was never called.
  void apply(std::vector<troupe::named_tensor>& vars,
             const std::vector<troupe::named_tensor>& grads);

  // As apply(), but only the elements in `ranges` ([begin, end) over the
  // variables concatenated in order) and their slots are updated: a sharded
  // (ZeRO-1) update, where each replica updates its reduce-scatter segments
  // and an all-gather spreads the result. step() advances as for apply().
  void apply_ranges(std::vector<troupe::named_tensor>& vars,
                    const std::vector<troupe::named_tensor>& grads,
                    const std::vector<std::pair<int64_t, int64_t>>& ranges);

  // One update of every variable where it lives: w[i], g[i] and slots[k][i]
  // (slot k of variable i) are pointers in one device's memory, in variable
  // order with the shapes of init(), and `ops` is that device's backend.
  // The schedule and step() advance as for apply(). On a discrete device the
  // slots live there too; slot_tensors() / state() are the host copies the
  // caller keeps current (compute_state's slots_to_host).
  void apply_on(backend& ops, const std::vector<float*>& w, const std::vector<const float*>& g,
                const std::vector<std::vector<float*>>& slots);
  const std::vector<troupe::shape_t>& shapes() const { return shapes_; }

  // Updates whose step is read on the device (a captured step, replayed
  // with no host in between; backend::adam_step_scheduled). Only Adam's
  // update has such a kernel: capturable() says whether this optimizer's
  // does, and why not.
  bool capturable(std::string* why) const;
  // The scalars of updates [first, first + count): 3 floats each (the
  // learning rate, Adam's step size lr / (1 - b1^t) and 1 / sqrt(1 - b2^t)
  // for the 1-based t), the floats apply_on uses for that update.
  std::vector<float> schedule_table(int64_t first, int64_t count) const;
  // apply_on's update as one scheduled kernel a variable: the step comes
  // from counter[0] and its scalars from table (schedule_table(0, n) in
  // device memory). step() does not move: advance() does, once the launches
  // it covers have run.
  void apply_scheduled(backend& ops, const std::vector<float*>& w,
                       const std::vector<const float*>& g,
                       const std::vector<std::vector<float*>>& slots, const float* table,
                       const int64_t* counter) const;
  void advance(int64_t updates) { step_ += updates; }
  int64_t total_steps() const { return total_steps_; }

  double current_lr() const;         // lr that the next apply() will use
  double lr_at(int64_t step) const;  // lr of the update after `step` updates
  int64_t step() const;              // updates done

  // State for checkpoints: slot tensors named "<var>/momentum",
  // "<var>/adam_m", "<var>/adam_v", "<var>/rms" (whichever the kind uses, in
  // variable order), plus "optimizer/step" (int64 tensor of shape [1]).
  // Returns clones.
  std::vector<troupe::named_tensor> state() const;
  // Restores from state() (after init() with the same variables); throws
  // std::runtime_error naming the missing or mis-shaped slot, leaving the
  // optimizer unchanged. Entries that are not ours are ignored.
  void load_state(const std::vector<troupe::named_tensor>& state);

  // The live slot tensors of slot k (slot_names()[k]), one per variable in
  // variable order: shared buffers, for an all-gather of sharded slots.
  std::vector<troupe::tensor> slot_tensors(std::size_t k) const { return slots_.at(k); }

  const troupe::optimizer_config& config() const { return cfg_; }
  // A new base learning rate (the schedule's lr) from the next update on:
  // population-based training's explore (strategies/population.cpp).
  void set_learning_rate(double lr) { cfg_.learning_rate = lr; }
  // The slot suffixes this kind keeps per variable ("momentum", ...).
  const std::vector<std::string>& slot_names() const { return slot_suffixes_; }

 private:
  troupe::optimizer_config cfg_;
  // Updates elements [off, off + n) of one variable with the kind's rule.
  void update_elements(backend& ops, float* w, const float* g, const std::vector<float*>& slot,
                       std::size_t n, int64_t t) const;
  int64_t total_steps_;
  int64_t step_ = 0;
  bool initialized_ = false;
  std::vector<std::string> slot_suffixes_;
  std::vector<std::string> names_;
  std::vector<troupe::shape_t> shapes_;
  // slots_[k][i]: slot k (index into slot_suffixes_) of variable i.
  std::vector<std::vector<troupe::tensor>> slots_;
};

}  // namespace troupe::kernels
