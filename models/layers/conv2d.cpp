// conv2d: [C, H, W] -> [filters, H', W'] (kernels/layer_ops.hpp: conv2d_shape
// for the arithmetic). kernel [filters, C / groups, kh, kw], bias [filters].
#include "models/layers/keys.hpp"

namespace troupe::layers {
namespace {

class conv2d final : public layer {
 public:
  conv2d(kernels::conv2d_shape s, bool bias) : s_(s), bias_(bias) {
    out_ = {s.out_channels, s.out_h(), s.out_w()};
  }
  void forward(run_context& rc, const float* x, float* y) override {
    s_.batch = rc.batch;
    rc.ops->conv2d_forward(s_, x, rc.vars[first_var], bias_ ? rc.vars[first_var + 1] : nullptr, y);
  }
  void backward(run_context& rc, const float* x, const float*, float* dy, float* dx) override {
    s_.batch = rc.batch;
    rc.ops->conv2d_backward(s_, x, rc.vars[first_var], dy, dx, rc.grads[first_var],
                            bias_ ? rc.grads[first_var + 1] : nullptr, rc.accumulate);
  }

 private:
  kernels::conv2d_shape s_;
  bool bias_;
};

}  // namespace

std::unique_ptr<layer> build_conv2d(const json& spec, const std::string& path, const shape& in,
                                    const json* next, build_context& bc) {
  object_reader r(
      spec, path,
      {"type", "filters", "kernel", "stride", "padding", "dilation", "groups", "use_bias", "init"});
  if (in.size() != 3) needs_input(path, "conv2d", "[C,H,W]", in);
  int64_t filters = 0;
  r.with("filters", [&](const json& v, const std::string& p) {
    filters = json_read::read_int_in(v, p, 1, 1 << 16);
  });
  if (!filters) json_read::fail(r.path("filters"), "missing: the output channels, an integer >= 1");
  const json* k = r.get("kernel");
  if (!k) json_read::fail(r.path("kernel"), "missing: the kernel size, an integer or [h, w]");
  hw kernel = read_hw(*k, r.path("kernel"), 1);
  hw stride, dilation;
  r.with("stride", [&](const json& v, const std::string& p) { stride = read_hw(v, p, 1); });
  r.with("dilation", [&](const json& v, const std::string& p) { dilation = read_hw(v, p, 1); });
  int64_t groups = 1;
  r.with("groups", [&](const json& v, const std::string& p) {
    groups = json_read::read_int_in(v, p, 1, 1 << 16);
    if (in[0] % groups || filters % groups)
      json_read::fail(p, "groups " + std::to_string(groups) + " must divide the input channels (" +
                             std::to_string(in[0]) + ") and filters (" + std::to_string(filters) +
                             ")");
  });
  hw extent{dilation.h * (kernel.h - 1) + 1, dilation.w * (kernel.w - 1) + 1};
  padding pad;
  r.with("padding", [&](const json& v, const std::string& p) {
    pad = read_padding(v, p, {in[1], in[2]}, extent, stride);
  });
  bool bias = true;
  r.with("use_bias",
         [&](const json& v, const std::string& p) { bias = json_read::read_bool(v, p); });
  kernels::conv2d_shape s;
  s.in_channels = in[0];
  s.in_h = in[1];
  s.in_w = in[2];
  s.out_channels = filters;
  set_window(s, kernel, stride, pad);
  s.dilation_h = dilation.h;
  s.dilation_w = dilation.w;
  s.groups = groups;
  if (s.out_h() < 1 || s.out_w() < 1)
    json_read::fail(path, "conv2d: a " + std::to_string(extent.h) + "x" + std::to_string(extent.w) +
                              " window does not fit the padded " + describe(in) + " input");
  auto init = resolve_init(read_init(r), next);
  bc.reserve(path, {filters, in[0] / groups * kernel.h * kernel.w + 1});
  auto l = std::make_unique<conv2d>(s, bias);
  auto name = bc.name_for("conv2d");
  tensor w = bc.zeros({filters, in[0] / groups, kernel.h, kernel.w});
  init_kernel(w, init, in[0] / groups * kernel.h * kernel.w, filters / groups * kernel.h * kernel.w,
              bc.seed, bc.next_stream++);
  l->first_var = bc.add_variable(name + "/kernel", std::move(w));
  if (bias) bc.add_variable(name + "/bias", bc.zeros({filters}));
  l->last_var = bc.vars->size();
  return l;
}

}  // namespace troupe::layers
