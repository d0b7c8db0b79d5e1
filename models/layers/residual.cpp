// residual: y = x + f(x), f its own "layers" (which must keep the shape).
#include "models/layers/keys.hpp"
#include "models/layers/stack.hpp"

namespace troupe::layers {
namespace {

class residual final : public layer {
 public:
  residual(const json& specs, const std::string& path, const shape& in, build_context& bc)
      : inner_(specs, json_read::join(path, "layers"), in, bc) {
    if (inner_.output() != in)
      json_read::fail(path, "residual: its layers turn " + describe(in) + " into " +
                                describe(inner_.output()) + "; they must keep the shape");
    out_ = in;
  }
  void forward(run_context& rc, const float* x, float* y) override {
    const float* f = inner_.forward(rc, x);
    rc.ops->copy(y, f, size(rc));
    rc.ops->add_inplace(y, x, size(rc));
  }
  void idle_forward(run_context& rc) override { inner_.idle_forward(rc); }
  void idle_backward(run_context& rc) override { inner_.idle_backward(rc); }
  void backward(run_context& rc, const float* x, const float*, float* dy, float* dx) override {
    // The inner layers may overwrite their dy: they get a copy.
    const auto bytes = size(rc) * sizeof(float);
    if (dcopy_.bytes() < bytes) dcopy_ = rc.dev->allocate(bytes);
    rc.ops->copy(dcopy_.f32(), dy, size(rc));
    inner_.backward(rc, x, dcopy_.f32(), dx, nullptr);
    if (dx) rc.ops->add_inplace(dx, dy, size(rc));
  }

 private:
  std::size_t size(const run_context& rc) const {
    return static_cast<std::size_t>(rc.batch * numel(out_));
  }
  layer_stack inner_;
  device_buffer dcopy_;
};

}  // namespace

std::unique_ptr<layer> build_residual(const json& spec, const std::string& path, const shape& in,
                                      const json*, build_context& bc) {
  object_reader r(spec, path, {"type", "layers"});
  const json* specs = r.get("layers");
  if (!specs) json_read::fail(r.path("layers"), "missing: the block's layers");
  const auto first = bc.vars->size();
  auto l = std::make_unique<residual>(*specs, path, in, bc);
  l->first_var = first;
  l->last_var = bc.vars->size();
  return l;
}

}  // namespace troupe::layers
