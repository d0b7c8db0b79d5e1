#include "models/device_policy.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "models/gaussian_policy.hpp"

namespace troupe {
namespace {

namespace k = troupe::kernels;

void expect_variable(const std::vector<named_tensor>& vars, std::size_t i, const std::string& name,
                     const shape_t& shape) {
  if (i >= vars.size() || vars[i].name != name || vars[i].value.shape() != shape ||
      vars[i].value.type() != dtype::f32)
    throw std::invalid_argument(
        "device policy: expected variable " + std::to_string(i) + " to be '" + name + "' " +
        shape_string(shape) + " float32, got " +
        (i < vars.size() ? "'" + vars[i].name + "' " + shape_string(vars[i].value.shape())
                         : std::string("none")));
}

// The host policy_value_mlp `host` (its variables and their layout) with
// its layers on the device: torso_l/kernel, torso_l/bias, ..., the policy
// and value heads.
class device_policy_value final : public policy_value_model {
 public:
  device_policy_value(std::shared_ptr<device_context> ctx, const model_config& c,
                      std::unique_ptr<policy_value_model> host)
      : ctx_(std::move(ctx)), host_(std::move(host)) {
    act_ = c.activation == "tanh" ? k::activation::tanh : k::activation::relu;
    const auto& vars = host_->variables();
    widths_.push_back(vars.empty() || vars.front().value.rank() != 2 ? 0
                                                                     : vars.front().value.dim(0));
    for (std::size_t l = 0; l < c.hidden.size(); ++l) {
      const std::string layer = "torso_" + std::to_string(l);
      expect_variable(vars, 2 * l, layer + "/kernel", {widths_.back(), c.hidden[l]});
      expect_variable(vars, 2 * l + 1, layer + "/bias", {c.hidden[l]});
      widths_.push_back(c.hidden[l]);
    }
    const std::size_t heads = 2 * c.hidden.size();
    const int64_t h = widths_.back();
    actions_ = heads < vars.size() && vars[heads].value.rank() == 2 ? vars[heads].value.dim(1) : 0;
    expect_variable(vars, heads, "policy/kernel", {h, actions_});
    expect_variable(vars, heads + 1, "policy/bias", {actions_});
    expect_variable(vars, heads + 2, "value/kernel", {h, 1});
    expect_variable(vars, heads + 3, "value/bias", {1});
    for (const auto& v : vars) {
      vars_.push_back(ctx_->allocate(v.value.nbytes()));
      grads_.push_back(ctx_->allocate(v.value.nbytes()));
    }
  }

  std::vector<named_tensor>& variables() override { return host_->variables(); }
  int64_t input_size() override { return widths_.front(); }

  void forward(const float* obs, int64_t b, float* logits, float* values) override {
    reserve(b);
    auto& vars = host_->variables();
    for (std::size_t i = 0; i < vars_.size(); ++i)
      ctx_->copy_to_device(vars_[i].data(), vars[i].value.raw(), vars[i].value.nbytes());
    ctx_->copy_to_device(obs_.data(), obs, floats(b * widths_.front()));
    auto& ops = ctx_->ops();
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l)
      ops.dense_forward(l == 0 ? obs_.f32() : acts_[l - 1].f32(), vars_[2 * l].f32(),
                        vars_[2 * l + 1].f32(), acts_[l].f32(), b, widths_[l], widths_[l + 1],
                        act_);
    const std::size_t L = widths_.size() - 1;
    const int64_t h = widths_.back();
    ops.dense_forward(acts_[L - 1].f32(), vars_[2 * L].f32(), vars_[2 * L + 1].f32(), logits_.f32(),
                      b, h, actions_, k::activation::none);
    ops.dense_forward(acts_[L - 1].f32(), vars_[2 * L + 2].f32(), vars_[2 * L + 3].f32(),
                      values_.f32(), b, h, 1, k::activation::none);
    ctx_->copy_to_host(logits, logits_.f32(), floats(b * actions_));
    ctx_->copy_to_host(values, values_.f32(), floats(b));
    forwarded_ = b;
  }

  // As policy_value_mlp::backward, call for call, on the device.
  void backward(const float* /*obs: still on the device*/, int64_t b, const float* dlogits,
                const float* dvalues, std::vector<named_tensor>& grads, bool accumulate) override {
    if (grads.size() != vars_.size())
      throw std::invalid_argument("device policy: wrong gradient count");
    if (forwarded_ != b)
      throw std::logic_error("device policy: backward without a forward on this batch");
    if (accumulate)
      for (std::size_t i = 0; i < grads_.size(); ++i)
        ctx_->copy_to_device(grads_[i].data(), grads[i].value.raw(), grads[i].value.nbytes());
    ctx_->copy_to_device(dlogits_.data(), dlogits, floats(b * actions_));
    ctx_->copy_to_device(dvalues_.data(), dvalues, floats(b));
    backward_on_device(b, accumulate);
    for (std::size_t i = 0; i < grads_.size(); ++i)
      ctx_->copy_to_host(grads[i].value.raw(), grads_[i].data(), grads[i].value.nbytes());
  }

 private:
  static std::size_t floats(int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); }

  void backward_on_device(int64_t b, bool accumulate) {
    auto& ops = ctx_->ops();
    const std::size_t L = widths_.size() - 1;
    const int64_t h = widths_.back();
    const float* top = acts_[L - 1].f32();
    ops.dense_backward(top, vars_[2 * L].f32(), dlogits_.f32(), dtop_.f32(), grads_[2 * L].f32(),
                       grads_[2 * L + 1].f32(), b, h, actions_, accumulate);
    ops.dense_backward(top, vars_[2 * L + 2].f32(), dvalues_.f32(), dtop_v_.f32(),
                       grads_[2 * L + 2].f32(), grads_[2 * L + 3].f32(), b, h, 1, accumulate);
    ops.add_inplace(dtop_.f32(), dtop_v_.f32(), static_cast<std::size_t>(b * h));
    float* d = dtop_.f32();
    for (std::size_t l = L; l-- > 0;) {
      const auto n = static_cast<std::size_t>(b * widths_[l + 1]);
      if (act_ == k::activation::tanh)
        ops.tanh_backward(acts_[l].f32(), d, d, n);
      else
        ops.relu_backward(acts_[l].f32(), d, d, n);
      float* din = l > 0 ? (d == dtop_.f32() ? dnext_.f32() : dtop_.f32()) : nullptr;
      ops.dense_backward(l == 0 ? obs_.f32() : acts_[l - 1].f32(), vars_[2 * l].f32(), d, din,
                         grads_[2 * l].f32(), grads_[2 * l + 1].f32(), b, widths_[l],
                         widths_[l + 1], accumulate);
      if (din) d = din;
    }
  }

  // Activation and gradient buffers for batches of up to b rows.
  void reserve(int64_t b) {
    if (b <= capacity_) return;
    int64_t widest = widths_.front();
    for (auto w : widths_) widest = std::max(widest, w);
    auto rows_of = [&](int64_t n) { return ctx_->allocate(floats(b * n)); };
    obs_ = rows_of(widths_.front());
    acts_.clear();
    for (std::size_t l = 1; l < widths_.size(); ++l) acts_.push_back(rows_of(widths_[l]));
    logits_ = rows_of(actions_);
    values_ = rows_of(1);
    dlogits_ = rows_of(actions_);
    dvalues_ = rows_of(1);
    dtop_ = rows_of(widest);
    dtop_v_ = rows_of(widths_.back());
    dnext_ = rows_of(widest);
    capacity_ = b;
  }

  std::shared_ptr<device_context> ctx_;
  std::unique_ptr<policy_value_model> host_;  // the variables, and their layout
  k::activation act_ = k::activation::tanh;
  std::vector<int64_t> widths_;  // observation size, then each hidden layer
  int64_t actions_ = 0;
  std::vector<device_buffer> vars_, grads_;
  int64_t capacity_ = 0;   // rows the buffers hold
  int64_t forwarded_ = 0;  // rows of the last forward (backward's batch)
  device_buffer obs_, logits_, values_, dlogits_, dvalues_, dtop_, dtop_v_, dnext_;
  std::vector<device_buffer> acts_;
};

}  // namespace

std::unique_ptr<policy_value_model> create_policy_value_model_on(
    const std::shared_ptr<device_context>& ctx, const model_config& c, int64_t observation_size,
    const policy_head& head, uint64_t seed) {
  if (!ctx || ctx->shares_host_memory())
    return create_policy_value_model(c, observation_size, head, seed);
  if (c.kind != "policy_value_mlp")
    throw std::invalid_argument("a policy on " + ctx->spec().str() +
                                " runs model.kind \"policy_value_mlp\", got \"" + c.kind + "\"");
  std::unique_ptr<policy_value_model> net = std::make_unique<device_policy_value>(
      ctx, c, create_policy_value_model(c, observation_size, head.actions, seed));
  if (head.distribution == action_distribution::softmax) return net;
  return make_gaussian_policy(std::move(net), head.actions, head.initial_log_std);
}

}  // namespace troupe
