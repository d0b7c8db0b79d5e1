// relu, leaky_relu (alpha: the slope below 0, default 0.01 as PyTorch),
// gelu (exact), tanh, sigmoid: element-wise, any shape.
#include "models/layers/keys.hpp"

namespace troupe::layers {
namespace {

class pointwise final : public layer {
 public:
  pointwise(kernels::unary_op op, float alpha, const shape& in) : op_(op), alpha_(alpha) {
    out_ = in;
  }
  void forward(run_context& rc, const float* x, float* y) override {
    rc.ops->unary_forward(op_, alpha_, x, y, size(rc));
  }
  void backward(run_context& rc, const float* x, const float* y, float* dy, float* dx) override {
    if (dx) rc.ops->unary_backward(op_, alpha_, x, y, dy, dx, size(rc));
  }

 private:
  std::size_t size(const run_context& rc) const {
    return static_cast<std::size_t>(rc.batch * numel(out_));
  }
  kernels::unary_op op_;
  float alpha_;
};

}  // namespace

std::unique_ptr<layer> build_pointwise(const json& spec, const std::string& path, const shape& in,
                                       const json*, build_context&) {
  auto type = type_of(&spec);
  float alpha = 0.01f;
  if (type == "leaky_relu") {
    object_reader r(spec, path, {"type", "alpha"});
    r.with("alpha", [&](const json& v, const std::string& p) {
      alpha = static_cast<float>(json_read::read_number(v, p, json_read::non_negative));
    });
  } else {
    object_reader r(spec, path, {"type"});
  }
  using kernels::unary_op;
  unary_op op = type == "relu"         ? unary_op::relu
                : type == "leaky_relu" ? unary_op::leaky_relu
                : type == "gelu"       ? unary_op::gelu
                : type == "tanh"       ? unary_op::tanh
                                       : unary_op::sigmoid;
  return std::make_unique<pointwise>(op, alpha, in);
}

}  // namespace troupe::layers
