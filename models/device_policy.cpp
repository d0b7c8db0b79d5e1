#include "models/device_policy.hpp"

#include <stdexcept>
#include <string>

namespace troupe {
namespace {

void expect_variable(const std::vector<named_tensor>& vars, std::size_t i, const std::string& name,
                     const shape_t& shape) {
  if (i >= vars.size() || vars[i].name != name || vars[i].value.shape() != shape ||
      vars[i].value.type() != dtype::f32)
    throw std::invalid_argument(
        "device_policy: expected variable " + std::to_string(i) + " to be '" + name + "' " +
        shape_string(shape) + " float32, got " +
        (i < vars.size() ? "'" + vars[i].name + "' " + shape_string(vars[i].value.shape())
                         : std::string("none")));
}

}  // namespace

device_policy::device_policy(std::shared_ptr<device_context> ctx, const model_config& c,
                             const std::vector<named_tensor>& vars)
    : ctx_(std::move(ctx)) {
  if (c.kind != "policy_value_mlp")
    throw std::invalid_argument(
        "rl.central.device: an inference server on a device runs model.kind "
        "\"policy_value_mlp\", got \"" +
        c.kind + "\"");
  act_ = c.activation == "tanh" ? kernels::activation::tanh : kernels::activation::relu;
  if (vars.empty() || vars.front().value.rank() != 2)
    throw std::invalid_argument("device_policy: the policy has no first kernel");
  widths_.push_back(vars.front().value.dim(0));
  for (std::size_t l = 0; l < c.hidden.size(); ++l) {
    const std::string layer = "torso_" + std::to_string(l);
    expect_variable(vars, 2 * l, layer + "/kernel", {widths_.back(), c.hidden[l]});
    expect_variable(vars, 2 * l + 1, layer + "/bias", {c.hidden[l]});
    widths_.push_back(c.hidden[l]);
  }
  const std::size_t heads = 2 * c.hidden.size();
  const int64_t h = widths_.back();
  if (heads >= vars.size() || vars[heads].value.rank() != 2)
    throw std::invalid_argument("device_policy: the policy has no 'policy/kernel'");
  actions_ = vars[heads].value.dim(1);
  expect_variable(vars, heads, "policy/kernel", {h, actions_});
  expect_variable(vars, heads + 1, "policy/bias", {actions_});
  expect_variable(vars, heads + 2, "value/kernel", {h, 1});
  expect_variable(vars, heads + 3, "value/bias", {1});
  gaussian_ = vars.size() == heads + 5;
  if (gaussian_) expect_variable(vars, heads + 4, "policy/log_std", {actions_});
  if (vars.size() != heads + (gaussian_ ? 5 : 4))
    throw std::invalid_argument("device_policy: " + std::to_string(vars.size()) +
                                " variables, expected " + std::to_string(heads + 4) + " or " +
                                std::to_string(heads + 5));
  for (std::size_t i = 0; i < heads + 4; ++i)
    vars_.push_back(ctx_->allocate(vars[i].value.nbytes()));
  upload(vars);
}

void device_policy::upload(const std::vector<named_tensor>& vars) {
  for (std::size_t i = 0; i < vars_.size(); ++i)
    ctx_->copy_to_device(vars_[i].data(), vars[i].value.raw(), vars[i].value.nbytes());
  if (gaussian_) {
    const auto& s = vars[vars_.size()].value;
    log_std_.assign(s.f32(), s.f32() + s.numel());
  }
}

void device_policy::reserve(int64_t rows) {
  if (rows <= capacity_) return;
  auto floats = [&](int64_t n) {
    return ctx_->allocate(static_cast<std::size_t>(rows * n) * sizeof(float));
  };
  obs_ = floats(widths_.front());
  acts_.clear();
  for (std::size_t l = 1; l < widths_.size(); ++l) acts_.push_back(floats(widths_[l]));
  logits_ = floats(actions_);
  values_ = floats(1);
  capacity_ = rows;
}

void device_policy::forward(const float* obs, int64_t rows, float* outputs, float* values) {
  reserve(rows);
  auto& ops = ctx_->ops();
  const int64_t O = widths_.front(), A = actions_;
  ctx_->copy_to_device(obs_.data(), obs, static_cast<std::size_t>(rows * O) * sizeof(float));
  const float* in = obs_.f32();
  for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
    ops.dense_forward(in, vars_[2 * l].f32(), vars_[2 * l + 1].f32(), acts_[l].f32(), rows,
                      widths_[l], widths_[l + 1], act_);
    in = acts_[l].f32();
  }
  const std::size_t heads = 2 * (widths_.size() - 1);
  const int64_t h = widths_.back();
  ops.dense_forward(in, vars_[heads].f32(), vars_[heads + 1].f32(), logits_.f32(), rows, h, A,
                    kernels::activation::none);
  ops.dense_forward(in, vars_[heads + 2].f32(), vars_[heads + 3].f32(), values_.f32(), rows, h, 1,
                    kernels::activation::none);
  ctx_->copy_to_host(values, values_.f32(), static_cast<std::size_t>(rows) * sizeof(float));
  if (!gaussian_) {
    ctx_->copy_to_host(outputs, logits_.f32(), static_cast<std::size_t>(rows * A) * sizeof(float));
    return;
  }
  // A Gaussian's row: the means, then the (state-independent) log-stds.
  std::vector<float> means(static_cast<std::size_t>(rows * A));
  ctx_->copy_to_host(means.data(), logits_.f32(), means.size() * sizeof(float));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(means.begin() + r * A, means.begin() + (r + 1) * A, outputs + r * 2 * A);
    std::copy(log_std_.begin(), log_std_.end(), outputs + r * 2 * A + A);
  }
}

}  // namespace troupe
