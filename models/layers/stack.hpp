#pragma once
// A sequence of layers run one after another: the model's whole network, and
// the inside of a residual block. It owns each layer's output buffer (kept
// from the forward for the backward) and two gradient buffers it alternates
// between going down.
#include <functional>

#include "models/layers/layer.hpp"

namespace troupe::layers {

class layer_stack {
 public:
  // Builds model.layers (or a residual's layers) at `path` over input `in`.
  layer_stack(const nlohmann::json& specs, const std::string& path, const shape& in,
              build_context& bc);

  const shape& input() const { return in_; }
  const shape& output() const { return layers_.empty() ? in_ : layers_.back()->output(); }
  const std::vector<std::unique_ptr<layer>>& layers() const { return layers_; }

  // Runs x forward; the output stays valid until the next forward.
  const float* forward(run_context& rc, const float* x);
  // From dy (the gradient of the output; overwritten) down to dx (null: not
  // needed). After each layer whose variables are then final, ready(first,
  // last) is called (null: nobody asks).
  using ready_fn = std::function<void(std::size_t first, std::size_t last)>;
  void backward(run_context& rc, const float* x, float* dy, float* dx, const ready_fn& ready);
  // Joins the collectives of a pass with no rows (layer::idle_forward).
  void idle_forward(run_context& rc);
  void idle_backward(run_context& rc);

 private:
  shape in_;
  std::vector<std::unique_ptr<layer>> layers_;
  std::vector<device_buffer> outs_;    // per layer (views: none)
  std::vector<const float*> out_ptr_;  // per layer, of the last forward
  device_buffer grad_[2];
};

}  // namespace troupe::layers
