// dense: y[units] = x[features] * kernel[features, units] + bias[units].
// An activation right after it (relu, tanh) is fused into the product's
// epilogue and into the bias gradient's pass, as the MLP always did.
#include "models/layers/keys.hpp"

namespace troupe::layers {
namespace {

class dense final : public layer {
 public:
  dense(int64_t in, int64_t units, bool bias, kernels::activation act)
      : in_(in), units_(units), bias_(bias), act_(act) {
    out_ = {units};
  }
  void forward(run_context& rc, const float* x, float* y) override {
    rc.ops->dense_forward(x, rc.vars[first_var], bias_ ? rc.vars[first_var + 1] : nullptr, y,
                          rc.batch, in_, units_, act_);
  }
  void backward(run_context& rc, const float* x, const float* y, float* dy, float* dx) override {
    // dy becomes the pre-activation gradient, the bias gradient from the
    // same pass.
    rc.ops->activation_backward_bias(act_, act_ == kernels::activation::none ? nullptr : y, dy, dy,
                                     bias_ ? rc.grads[first_var + 1] : nullptr, rc.batch, units_,
                                     rc.accumulate);
    rc.ops->dense_backward(x, rc.vars[first_var], dy, dx, rc.grads[first_var], nullptr, rc.batch,
                           in_, units_, rc.accumulate);
  }

 private:
  int64_t in_, units_;
  bool bias_;
  kernels::activation act_;
};

}  // namespace

std::unique_ptr<layer> build_dense(const json& spec, const std::string& path, const shape& in,
                                   const json* next, build_context& bc) {
  object_reader r(spec, path, {"type", "units", "use_bias", "init"});
  if (in.size() != 1) needs_input(path, "dense", "[features] (flatten first)", in);
  int64_t units = 0;
  r.with("units", [&](const json& v, const std::string& p) {
    units = json_read::read_int_in(v, p, 1, 1 << 24);
  });
  if (!units) json_read::fail(r.path("units"), "missing: the number of outputs, an integer >= 1");
  bool bias = true;
  r.with("use_bias",
         [&](const json& v, const std::string& p) { bias = json_read::read_bool(v, p); });
  auto init = resolve_init(read_init(r), next);
  // relu or tanh right after, with no keys of its own: fused.
  auto act = kernels::activation::none;
  auto t = type_of(next);
  if ((t == "relu" || t == "tanh") && next->size() == 1) {
    act = t == "relu" ? kernels::activation::relu : kernels::activation::tanh;
    bc.consumed_next = true;
  }
  bc.reserve(path, {in[0] + 1, units});
  auto l = std::make_unique<dense>(in[0], units, bias, act);
  auto name = bc.name_for("dense");
  tensor w = bc.zeros({in[0], units});
  init_kernel(w, init, in[0], units, bc.seed, bc.next_stream++);
  l->first_var = bc.add_variable(name + "/kernel", std::move(w));
  if (bias) bc.add_variable(name + "/bias", bc.zeros({units}));
  l->last_var = bc.vars->size();
  return l;
}

}  // namespace troupe::layers
