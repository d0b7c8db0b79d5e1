#include "models/layers/stack.hpp"

#include "config/json_read.hpp"
#include "models/layers/keys.hpp"

namespace troupe::layers {

using json_read::fail;

namespace {
// Only relu: a leaky slope or a saturating function can round two different
// inputs to one output, and pooling first would then pick another winner
// for the gradient.
bool relu_then_max_pool(const nlohmann::json& spec, const nlohmann::json& next) {
  return type_of(&spec) == "relu" && type_of(&next) == "max_pool2d";
}
}  // namespace

layer_stack::layer_stack(const nlohmann::json& specs, const std::string& path, const shape& in,
                         build_context& bc)
    : in_(in) {
  if (!specs.is_array() || specs.empty())
    json_read::expected(path, "a non-empty array of layer objects", specs);
  shape cur = in;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const nlohmann::json* next = i + 1 < specs.size() ? &specs[i + 1] : nullptr;
    if (next && relu_then_max_pool(specs[i], *next)) {
      // relu(max(a, b, ..)) = max(relu(a), relu(b), ..) and their gradients
      // reach the same inputs (where the maximum is <= 0 both give none):
      // pooling first applies the relu, both ways, to a quarter of the
      // values of a 2x2 window (conv, batch norm, relu, max pool blocks).
      bc.consumed_next = false;
      layers_.push_back(build_layer(*next, json_read::index(path, i + 1), cur, nullptr, bc));
      cur = layers_.back()->output();
      layers_.push_back(build_layer(specs[i], json_read::index(path, i), cur, nullptr, bc));
      cur = layers_.back()->output();
      ++i;
      continue;
    }
    bc.consumed_next = false;
    layers_.push_back(build_layer(specs[i], json_read::index(path, i), cur, next, bc));
    cur = layers_.back()->output();
    if (bc.consumed_next) ++i;  // an activation fused into the layer before it
  }
  outs_.resize(layers_.size());
  out_ptr_.resize(layers_.size());
}

const float* layer_stack::forward(run_context& rc, const float* x) {
  const float* cur = x;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    auto& l = *layers_[i];
    if (l.is_view()) {
      out_ptr_[i] = cur;
      continue;
    }
    const auto bytes = static_cast<std::size_t>(rc.batch * numel(l.output())) * sizeof(float);
    if (outs_[i].bytes() < bytes) outs_[i] = rc.dev->allocate(bytes);
    l.forward(rc, cur, outs_[i].f32());
    out_ptr_[i] = cur = outs_[i].f32();
  }
  return cur;
}

void layer_stack::backward(run_context& rc, const float* x, float* dy, float* dx,
                           const ready_fn& ready) {
  float* cur = dy;
  // Only views (a reshape of the input) before layer `first`: its dx is the
  // caller's, none when the caller wants none (a conv after a reshape then
  // skips its backward-data pass).
  std::size_t first = 0;
  while (first + 1 < layers_.size() && layers_[first]->is_view()) ++first;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    auto& l = *layers_[i];
    const float* in = i == 0 ? x : out_ptr_[i - 1];
    float* target = nullptr;
    if (i == 0 || (i == first && !dx)) {
      target = dx;
    } else if (!l.is_view()) {
      // The buffer cur is not in: the other of the two (or the first, when
      // cur is the caller's).
      const auto bytes =
          static_cast<std::size_t>(rc.batch * numel(layers_[i - 1]->output())) * sizeof(float);
      device_buffer& a = grad_[0];
      device_buffer& b = grad_[1];
      device_buffer& pick = (a && a.f32() == cur) ? b : a;
      if (pick.bytes() < bytes) pick = rc.dev->allocate(bytes);
      target = pick.f32();
    }
    if (l.is_view()) {
      if (i == 0 && dx && dx != cur)
        rc.ops->copy(dx, cur, static_cast<std::size_t>(rc.batch * numel(l.output())));
    } else {
      l.backward(rc, in, out_ptr_[i], cur, target);
      cur = target;
    }
    if (l.last_var > l.first_var && ready) ready(l.first_var, l.last_var);
  }
}

void layer_stack::idle_forward(run_context& rc) {
  for (auto& l : layers_) l->idle_forward(rc);
}

void layer_stack::idle_backward(run_context& rc) {
  for (std::size_t i = layers_.size(); i-- > 0;) layers_[i]->idle_backward(rc);
}

}  // namespace troupe::layers
