#include "models/gaussian_policy.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/model.hpp"

namespace troupe {
namespace {

const double half_log_2pi = 0.5 * std::log(2 * std::numbers::pi);

class gaussian_policy final : public policy_value_model {
 public:
  gaussian_policy(std::unique_ptr<policy_value_model> means, int64_t dims, double initial_log_std)
      : means_(std::move(means)), dims_(dims) {
    if (dims < 1) throw std::invalid_argument("gaussian policy: expected at least 1 dimension");
    vars_ = means_->variables();
    tensor log_std({dims});
    for (int64_t d = 0; d < dims; ++d) log_std.f32()[d] = static_cast<float>(initial_log_std);
    vars_.push_back({"policy/log_std", log_std});
  }

  std::vector<named_tensor>& variables() override { return vars_; }
  action_distribution distribution() const override { return action_distribution::gaussian; }
  int64_t input_size() override { return means_->input_size(); }

  void forward(const float* obs, int64_t b, float* outputs, float* values) override {
    share_variables();
    mean_.resize(static_cast<std::size_t>(b * dims_));
    means_->forward(obs, b, mean_.data(), values);
    const float* log_std = vars_.back().value.f32();
    for (int64_t r = 0; r < b; ++r)
      for (int64_t d = 0; d < dims_; ++d) {
        outputs[r * 2 * dims_ + d] = mean_[static_cast<std::size_t>(r * dims_ + d)];
        outputs[r * 2 * dims_ + dims_ + d] = log_std[d];
      }
  }

  void backward(const float* obs, int64_t b, const float* doutputs, const float* dvalues,
                std::vector<named_tensor>& grads, bool accumulate) override {
    if (grads.size() != vars_.size())
      throw std::invalid_argument("gaussian policy: wrong gradient count");
    share_variables();
    dmean_.resize(static_cast<std::size_t>(b * dims_));
    for (int64_t r = 0; r < b; ++r)
      for (int64_t d = 0; d < dims_; ++d)
        dmean_[static_cast<std::size_t>(r * dims_ + d)] = doutputs[r * 2 * dims_ + d];
    mean_grads_.assign(grads.begin(), grads.end() - 1);  // the same buffers
    means_->backward(obs, b, dmean_.data(), dvalues, mean_grads_, accumulate);
    float* g = grads.back().value.f32();
    for (int64_t d = 0; d < dims_; ++d) {
      double sum = 0;
      for (int64_t r = 0; r < b; ++r) sum += doutputs[r * 2 * dims_ + dims_ + d];
      g[d] = static_cast<float>(sum) + (accumulate ? g[d] : 0.0f);
    }
  }

 private:
  // Our variables are the truth (a checkpoint's restore replaces their
  // buffers): the means' network reads the same buffers.
  void share_variables() {
    auto& inner = means_->variables();
    for (std::size_t i = 0; i < inner.size(); ++i) inner[i].value = vars_[i].value;
  }

  std::unique_ptr<policy_value_model> means_;
  int64_t dims_;
  std::vector<named_tensor> vars_;  // the means' network's, then policy/log_std
  std::vector<named_tensor> mean_grads_;
  std::vector<float> mean_, dmean_;
};

}  // namespace

std::unique_ptr<policy_value_model> make_gaussian_policy(std::unique_ptr<policy_value_model> means,
                                                         int64_t dims, double initial_log_std) {
  return std::make_unique<gaussian_policy>(std::move(means), dims, initial_log_std);
}

void gaussian_log_probs(const float* outputs, const float* actions, int64_t n, int64_t dims,
                        float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* mu = outputs + t * 2 * dims;
    const float* log_std = mu + dims;
    double logp = 0;
    for (int64_t d = 0; d < dims; ++d) {
      const double z = (static_cast<double>(actions[t * dims + d]) - mu[d]) /
                       std::exp(static_cast<double>(log_std[d]));
      logp += -0.5 * z * z - log_std[d] - half_log_2pi;
    }
    out[t] = static_cast<float>(logp);
  }
}

impala_loss gaussian_loss_and_gradients(const float* outputs, const float* values,
                                        const float* actions, const float* vs,
                                        const float* pg_advantages, int64_t n, int64_t dims,
                                        double baseline_cost, double entropy_cost, float* doutputs,
                                        float* dvalues) {
  impala_loss out;
  for (int64_t t = 0; t < n; ++t) {
    const float* mu = outputs + t * 2 * dims;
    const float* log_std = mu + dims;
    float* dmu = doutputs + t * 2 * dims;
    float* dlog_std = dmu + dims;
    const double adv = pg_advantages[t];
    for (int64_t d = 0; d < dims; ++d) {
      const double sigma = std::exp(static_cast<double>(log_std[d]));
      const double z = (static_cast<double>(actions[t * dims + d]) - mu[d]) / sigma;
      out.policy -= adv * (-0.5 * z * z - log_std[d] - half_log_2pi);
      out.entropy += log_std[d] + 0.5 + half_log_2pi;
      // d(-adv log p)/dmu = -adv z / sigma; d(-adv log p)/dlog_std =
      // -adv (z^2 - 1); d(-c H)/dlog_std = -c.
      dmu[d] = static_cast<float>(-adv * z / sigma);
      dlog_std[d] = static_cast<float>(-adv * (z * z - 1) - entropy_cost);
    }
    out.baseline += baseline_loss_and_gradient(values[t], vs[t], baseline_cost, dvalues[t]);
  }
  out.total = out.policy + out.baseline - entropy_cost * out.entropy;
  return out;
}

}  // namespace troupe
