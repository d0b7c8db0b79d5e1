// max_pool2d, avg_pool2d: [C, H, W] -> [C, H', W'] over size x size windows
// (stride: the size unless given); global_avg_pool2d: [C, H, W] -> [C].
// Max pooling keeps its winners in a workspace between forward and backward.
#include "models/layers/keys.hpp"

namespace troupe::layers {
namespace {

class pool2d final : public layer {
 public:
  pool2d(kernels::pool2d_shape s, bool global) : s_(s) {
    out_ = global ? shape{s.channels} : shape{s.channels, s.out_h(), s.out_w()};
  }
  void forward(run_context& rc, const float* x, float* y) override {
    s_.batch = rc.batch;
    void* ws = nullptr;
    if (rc.training) {
      auto bytes = rc.ops->pool2d_workspace_bytes(s_);
      if (bytes && ws_.bytes() < bytes) ws_ = rc.dev->allocate(bytes);
      ws = bytes ? ws_.data() : nullptr;
    }
    rc.ops->pool2d_forward(s_, x, y, ws);
  }
  void backward(run_context& rc, const float* x, const float*, float* dy, float* dx) override {
    if (!dx) return;
    s_.batch = rc.batch;
    rc.ops->pool2d_backward(s_, x, dy, dx, ws_ ? ws_.data() : nullptr);
  }

 private:
  kernels::pool2d_shape s_;
  device_buffer ws_;
};

kernels::pool2d_shape base_shape(kernels::pool_kind kind, const shape& in) {
  kernels::pool2d_shape s;
  s.kind = kind;
  s.channels = in[0];
  s.in_h = in[1];
  s.in_w = in[2];
  return s;
}

}  // namespace

std::unique_ptr<layer> build_pool2d(const json& spec, const std::string& path, const shape& in,
                                    const json*, build_context&) {
  auto type = type_of(&spec);
  object_reader r(spec, path, {"type", "size", "stride", "padding"});
  if (in.size() != 3) needs_input(path, type, "[C,H,W]", in);
  hw size{2, 2};
  r.with("size", [&](const json& v, const std::string& p) { size = read_hw(v, p, 1); });
  hw stride = size;
  r.with("stride", [&](const json& v, const std::string& p) { stride = read_hw(v, p, 1); });
  padding pad;
  r.with("padding", [&](const json& v, const std::string& p) {
    pad = read_padding(v, p, {in[1], in[2]}, size, stride);
    if (pad.top >= size.h || pad.bottom >= size.h || pad.left >= size.w || pad.right >= size.w)
      json_read::fail(p, "padding must be smaller than the window (" + std::to_string(size.h) +
                             "x" + std::to_string(size.w) + ")");
  });
  auto s = base_shape(type == "max_pool2d" ? kernels::pool_kind::max : kernels::pool_kind::avg, in);
  set_window(s, size, stride, pad);
  if (s.out_h() < 1 || s.out_w() < 1)
    json_read::fail(path, type + ": a " + std::to_string(size.h) + "x" + std::to_string(size.w) +
                              " window does not fit the " + describe(in) + " input");
  return std::make_unique<pool2d>(s, false);
}

std::unique_ptr<layer> build_global_avg_pool2d(const json& spec, const std::string& path,
                                               const shape& in, const json*, build_context&) {
  object_reader r(spec, path, {"type"});
  if (in.size() != 3) needs_input(path, "global_avg_pool2d", "[C,H,W]", in);
  auto s = base_shape(kernels::pool_kind::avg, in);
  s.kernel_h = s.stride_h = in[1];
  s.kernel_w = s.stride_w = in[2];
  return std::make_unique<pool2d>(s, true);
}

}  // namespace troupe::layers
