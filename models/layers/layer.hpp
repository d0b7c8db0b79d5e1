#pragma once
// One layer of a layer model (models/layer_model.hpp): built once from its
// JSON object, knowing its input's shape, then run forward and backward on a
// batch through the device's backend (kernels/backend.hpp), so every layer
// runs on every device. Shapes are per example, channels first ([C, H, W]);
// the batch axis is implicit and every buffer is the batch's rows one after
// another.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "devices/device_context.hpp"
#include "kernels/backend.hpp"
#include "messages/tensor.hpp"

namespace troupe {
class process_group;
}

namespace troupe::layers {

using shape = std::vector<int64_t>;  // one example's, no batch axis

int64_t numel(const shape& s);
std::string describe(const shape& s);  // "[1,28,28]"

// What a layer sees of the model running it, for one batch.
struct run_context {
  kernels::backend* ops = nullptr;
  device_context* dev = nullptr;
  int64_t batch = 0;
  bool training = false;
  bool accumulate = false;  // add to the parameter gradients
  // Dropout: the job seed and the step folded (layers add their index), and
  // one id per row in device memory (the examples' indices in the data set).
  uint64_t step_seed = 0;
  // Steps on a device-resident data set: the step is counter[0] in device
  // memory (backend::gather_planned_rows), and dropout derives its masks'
  // seed there from base_seed (a captured step replays with each step's).
  const int64_t* step_counter = nullptr;
  uint64_t base_seed = 0;
  const int64_t* example_ids = nullptr;
  // Synchronised batch norm: the replicas' group (null: per replica).
  process_group* sync = nullptr;
  // The model's variables and their gradients, in variables() order, and
  // its buffers (state that is not trained: running statistics).
  std::vector<float*> vars, grads, bufs;
};

class layer {
 public:
  virtual ~layer() = default;
  const shape& output() const { return out_; }

  // A view (flatten, reshape): its output is its input, no work, no buffer.
  virtual bool is_view() const { return false; }
  virtual void forward(run_context& rc, const float* x, float* y) = 0;
  // Gradients of the layer's variables (accumulated when rc.accumulate) and
  // dx (null for the model's first layer: nobody needs it). dy belongs to
  // the layer: it may overwrite it.
  virtual void backward(run_context& rc, const float* x, const float* y, float* dy, float* dx) = 0;
  // A replica with no rows in this micro-batch still joins its group's
  // collectives (synchronised batch norm), in the order a pass makes them.
  virtual void idle_forward(run_context&) {}
  virtual void idle_backward(run_context&) {}

  // The layer's variables: [first_var, last_var) of the model's list.
  std::size_t first_var = 0, last_var = 0;

 protected:
  shape out_;
};

// What building a layer needs and adds to.
struct build_context {
  uint64_t seed = 0;
  std::vector<named_tensor>* vars = nullptr;     // trainable, in order
  std::vector<named_tensor>* buffers = nullptr;  // state saved with them (running statistics)
  // Per-type counters for names ("conv2d_0", "dense_1"), and the ordinal of
  // the next layer with variables (its initialisation stream).
  std::vector<std::pair<std::string, int64_t>> counters;
  uint64_t next_stream = 0;
  int64_t dropout_layers = 0;
  bool has_batch_norm = false;
  bool sync_batch_norm = false;  // any batch norm layer asks for "sync"
  bool consumed_next = false;    // the layer just built took in the spec after it
  int64_t layers_built = 0;      // before this one, nested ones included

  // "conv2d_<n>" with n counted per type.
  std::string name_for(const std::string& type);
  // Counts a variable of `dims` against the model's 2^28 parameters before
  // it is allocated; throws config_error at `path` past that.
  void reserve(const std::string& path, std::initializer_list<int64_t> dims);
  int64_t parameters = 0;
  // Only checking (check_layer_model): variables are not allocated.
  bool dry_run = false;
  // A tensor of `s` filled with `v` (dry run: an empty one).
  tensor zeros(shape_t s, float v = 0.0f) const;
  // A variable, added to vars; returns its index.
  std::size_t add_variable(const std::string& name, tensor value);
  std::size_t add_buffer(const std::string& name, tensor value);
};

// Builds the layer `spec` (one object of model.layers, at JSON path `path`)
// over an input of shape `in`; `next` is the spec after it (null at the end),
// which decides a kernel's default initialisation. Throws config_error
// naming the path for an unknown type, key, value or a shape it cannot take.
std::unique_ptr<layer> build_layer(const nlohmann::json& spec, const std::string& path,
                                   const shape& in, const nlohmann::json* next, build_context& bc);

// The layer types, for errors and the table in docs/models.md.
std::vector<std::string> layer_types();

}  // namespace troupe::layers
