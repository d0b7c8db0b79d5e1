#pragma once
// A model: named variables and one forward/backward over a batch. Models are
// registered by name (model.kind in the config) so users can add their own.
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/job_config.hpp"
#include "messages/tensor.hpp"

namespace troupe::kernels {
class optimizer;
}

namespace troupe {

class device_context;
class process_group;

struct batch_stats {
  double loss_sum = 0;  // sum of per-example losses
  int64_t correct = 0;
  int64_t count = 0;
};

class model {
 public:
  virtual ~model() = default;
  // The variables, in a fixed order; names are stable across strategies.
  virtual std::vector<named_tensor>& variables() = 0;
  // Forward + backward on x [B,F] / y [B] (B may be 0: zero gradients).
  // grads (from make_gradients()) get sum_over_batch(dloss/dw) * grad_scale,
  // so grad_scale = 1/global_batch yields the mean over the global batch.
  // With accumulate, the gradients are added to grads (gradient accumulation
  // over micro-batches) instead of replacing them.
  virtual batch_stats train_batch(const tensor& x, const tensor& y, float grad_scale,
                                  std::vector<named_tensor>& grads, bool accumulate = false) = 0;
  // Forward only.
  virtual batch_stats evaluate(const tensor& x, const tensor& y) = 0;
  // Zeroed gradient buffers shaped and named like variables().
  std::vector<named_tensor> make_gradients();

  // State that is not trained but saved with the variables and restored with
  // them (a batch norm's running statistics): names unique among variables
  // and buffers. On a device, staged with the variables (variables_to_host,
  // variables_to_device). Empty for most models.
  std::vector<named_tensor>& buffers() { return buffers_; }

  // The step and the examples' ids (int64 [b], their indices in the data
  // set) of the next train_batch, for what must not depend on how a batch is
  // split over replicas (dropout masks). Without ids, a row's id is its
  // position in the batch.
  virtual void set_step(int64_t /*step*/, const tensor* /*example_ids*/) {}
  // Whether the model normalises with statistics of the whole global batch
  // (synchronised batch norm), and the replicas' group to all-reduce them
  // over during train_batch (null: this replica's batch alone). Every replica
  // of the group must then run train_batch for each micro-batch, empty ones
  // too.
  virtual bool synced_statistics() const { return false; }
  virtual void set_statistics_group(process_group* /*group*/) {}

  // Device residency. A model built on a discrete device (sim:N, cuda:N:
  // create_model_on) keeps its variables and gradients in that device's
  // memory. Then train_batch leaves the gradients there and does not write
  // `grads`, and variables() is a host staging copy: current after
  // variables_to_host(), taken by the device at variables_to_device().
  // Models on the host (the default) need none of this: the calls do nothing.
  virtual bool device_resident() const { return false; }
  virtual device_context* device() { return nullptr; }
  virtual void variables_to_host() {}
  virtual void variables_to_device() {}
  virtual void gradients_to_host(std::vector<named_tensor>& /*grads*/) {}
  virtual void gradients_to_device(const std::vector<named_tensor>& /*grads*/) {}
  // Device pointers of the variables and of their gradients, in variables()
  // order (resident models), and the gradients as one contiguous block (for
  // fused collectives; null when they are not contiguous).
  // Starts copying a batch that a later train_batch will get (the same
  // tensors) to the device, overlapping the work issued after it. Nothing
  // to do on the host.
  virtual void prefetch(const tensor& /*x*/, const tensor& /*y*/) {}
  virtual std::vector<float*> device_variables() { return {}; }

  // Called by train_batch as soon as the gradients of variables [first,
  // last) are final for the batch. Backward runs from the top layer down, so
  // ranges come top first and end where the previous began; a data-parallel
  // strategy reduces each while the layers below are still in backward (as
  // PyTorch DDP does with its buckets). A model that never calls it leaves
  // everything to be reduced after train_batch (strategies must handle both).
  using gradients_ready_fn = std::function<void(std::size_t first, std::size_t last)>;
  void set_gradients_ready(gradients_ready_fn f) { gradients_ready_ = std::move(f); }
  virtual std::vector<float*> device_gradients() { return {}; }
  virtual float* device_gradient_block() { return nullptr; }

  // The training set on the device (models/resident_steps.hpp). A resident
  // model may take the whole set once, checked on the host (labels in range,
  // embedding ids): images [N, F] float32, labels [N] int32 or [N, K]
  // float32. False when it cannot (cpu:N: host memory already).
  virtual bool attach_dataset(const tensor& /*images*/, const tensor& /*labels*/) { return false; }
  // train_batch on `rows` rows of the attached set that the device gathers
  // itself (backend::gather_planned_rows with `plan` and `counter`), one
  // micro-batch, the loss sum and correct count added to device_stats():
  // nothing crosses between host and device, so a step can be captured.
  virtual void train_planned(const int64_t* /*plan*/, const int64_t* /*counter*/, int64_t /*rows*/,
                             float /*grad_scale*/) {
    throw std::logic_error("model: train_planned without an attached data set");
  }
  // Where train_planned ADDS its loss sum (double) and correct count: the
  // caller zeroes them (backend::fill_stats, record_step_stats).
  virtual std::pair<double*, int64_t*> device_stats() { return {nullptr, nullptr}; }
  // Whether train_planned may be captured as a graph and replayed: nothing
  // in it may depend on the host from one step to the next. Else false,
  // with why.
  virtual bool capturable(std::string* why) const {
    if (why) *why = "the model cannot be captured";
    return false;
  }

 protected:
  void gradients_ready(std::size_t first, std::size_t last) {
    if (gradients_ready_) gradients_ready_(first, last);
  }
  std::vector<named_tensor> buffers_;

 private:
  gradients_ready_fn gradients_ready_;
};

// Zeroed buffers shaped and named like `vars` (gradients of any model).
std::vector<named_tensor> gradients_like(const std::vector<named_tensor>& vars);

// Replaces `vars` (a network's variables) with the checkpoint's of the same
// names and the optimizer's slots with `slots`; returns the optimizer's step.
// Throws std::runtime_error naming a missing or mis-shaped variable (before
// changing anything) or a count that differs.
int64_t restore_variables_and_slots(std::vector<named_tensor>& vars, kernels::optimizer& opt,
                                    const std::vector<named_tensor>& variables,
                                    const std::vector<named_tensor>& slots);

// Copies the saved buffers of the same names into `bufs` (model::buffers());
// one the saved state lacks keeps its value (a checkpoint of a model without
// it). Throws std::runtime_error naming one of another shape, before
// changing anything.
void restore_buffers(std::vector<named_tensor>& bufs, const std::vector<named_tensor>& saved);

struct model_shape {
  model_shape() = default;
  model_shape(int64_t f, int64_t c, std::vector<int64_t> in = {}, int64_t t = 0)
      : features(f), classes(c), input(std::move(in)), targets(t) {}
  int64_t features = 0;        // values per example (the product of `input`)
  int64_t classes = 0;         // class labels: how many; float targets: 0
  std::vector<int64_t> input;  // one example's shape, channels first; empty: [features]
  int64_t targets = 0;         // float targets per example (mse, binary cross-entropy)
};

using model_factory =
    std::function<std::unique_ptr<model>(const model_config&, const model_shape&, uint64_t seed)>;

// Registers a factory under a name; throws std::invalid_argument if taken.
void register_model(const std::string& kind, model_factory f);
// Throws std::invalid_argument naming the known kinds for an unknown one,
// or when check_model_size refuses the model.
std::unique_ptr<model> create_model(const model_config& c, const model_shape& s, uint64_t seed);

// A model computing on the device of `ctx` (null or cpu:N: as create_model).
// Kinds with a device implementation are registered with
// register_device_model (the built-in mlp is); any other kind on a discrete
// device throws std::invalid_argument naming it and the device.
using device_model_factory = std::function<std::unique_ptr<model>(
    const model_config&, const model_shape&, uint64_t seed, std::shared_ptr<device_context>)>;
void register_device_model(const std::string& kind, device_model_factory f);
std::unique_ptr<model> create_model_on(const model_config& c, const model_shape& s, uint64_t seed,
                                       std::shared_ptr<device_context> ctx);
// Whether a kind can compute on a discrete device.
bool has_device_model(const std::string& kind);

// The most parameters a dense stack (inputs -> model.hidden... -> outputs)
// may have: 2^28 (1 GiB of float32; its gradients and optimizer slots take
// that again two or three times).
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 28;
// The parameter count of that stack (weights and biases), or -1 when it
// does not fit in int64.
int64_t dense_parameter_count(const model_config& c, int64_t inputs, int64_t outputs);
// Throws std::invalid_argument ("model.hidden: ... parameters ...") when the
// stack has more than kMaxModelParameters.
void check_model_size(const model_config& c, int64_t inputs, int64_t outputs);
std::vector<std::string> registered_models();

}  // namespace troupe
