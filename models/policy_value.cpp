#include "models/policy_value.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "config/registry.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/softmax.hpp"
#include "models/gaussian_policy.hpp"
#include "models/model.hpp"
#include "models/random.hpp"

namespace troupe {
namespace {

namespace k = troupe::kernels;

tensor init_kernel(int64_t in, int64_t out, const std::string& init, uint64_t seed, double gain) {
  tensor w({in, out});
  splitmix64 g(seed);
  float* p = w.f32();
  if (init == "he") {
    double sd = gain * std::sqrt(2.0 / static_cast<double>(in));
    for (int64_t i = 0; i < in * out; ++i) p[i] = static_cast<float>(g.normal() * sd);
  } else {
    double a = gain * std::sqrt(6.0 / static_cast<double>(in + out));
    for (int64_t i = 0; i < in * out; ++i) p[i] = static_cast<float>((2 * g.uniform() - 1) * a);
  }
  return w;
}

class policy_value_mlp final : public policy_value_model {
 public:
  policy_value_mlp(const model_config& c, int64_t obs_n, int64_t actions, uint64_t seed)
      : tanh_(c.activation == "tanh"), obs_n_(obs_n), actions_(actions) {
    if (c.activation != "relu" && c.activation != "tanh")
      throw std::invalid_argument("model.activation: expected \"relu\" or \"tanh\", got \"" +
                                  c.activation + "\"");
    if (obs_n <= 0 || actions <= 0)
      throw std::invalid_argument("policy_value_mlp: observation size and actions must be > 0");
    if (c.hidden.empty())
      throw std::invalid_argument("model.hidden: policy_value_mlp needs at least one layer");
    const std::string init = c.init == "auto" ? (tanh_ ? "glorot" : "he") : c.init;
    if (init != "he" && init != "glorot")
      throw std::invalid_argument("model.init: expected \"auto\", \"he\" or \"glorot\", got \"" +
                                  c.init + "\"");
    widths_.push_back(obs_n);
    for (auto h : c.hidden) widths_.push_back(h);
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      vars_.push_back({"torso_" + std::to_string(l) + "/kernel",
                       init_kernel(widths_[l], widths_[l + 1], init, derive_seed(seed, l), 1.0)});
      vars_.push_back({"torso_" + std::to_string(l) + "/bias", tensor({widths_[l + 1]})});
    }
    add_policy_value_heads(vars_, widths_.back(), actions, seed);
  }

  std::vector<named_tensor>& variables() override { return vars_; }

  void forward(const float* obs, int64_t b, float* logits, float* values) override {
    const std::size_t L = hidden_layers();
    acts_.resize(L);
    for (std::size_t l = 0; l < L; ++l) {
      shape_t s{b, widths_[l + 1]};
      if (acts_[l].shape() != s) acts_[l] = tensor(s);
      const float* in = l == 0 ? obs : acts_[l - 1].f32();
      k::dense_forward(in, vars_[2 * l].value.f32(), vars_[2 * l + 1].value.f32(), acts_[l].f32(),
                       b, widths_[l], widths_[l + 1],
                       tanh_ ? k::activation::tanh : k::activation::relu);
    }
    const float* top = acts_[L - 1].f32();
    const int64_t h = widths_.back();
    k::dense_forward(top, vars_[2 * L].value.f32(), vars_[2 * L + 1].value.f32(), logits, b, h,
                     actions_);
    k::dense_forward(top, vars_[2 * L + 2].value.f32(), vars_[2 * L + 3].value.f32(), values, b, h,
                     1);
  }

  void backward(const float* obs, int64_t b, const float* dlogits, const float* dvalues,
                std::vector<named_tensor>& grads, bool accumulate) override {
    if (grads.size() != vars_.size())
      throw std::invalid_argument("policy_value_mlp: wrong gradient count");
    const std::size_t L = hidden_layers();
    if (acts_.size() != L || acts_[L - 1].dim(0) != b)
      throw std::logic_error("policy_value_mlp: backward without a forward on this batch");
    const int64_t h = widths_.back();
    tensor dtop({b, h});
    tensor dtop_v({b, h});
    const float* top = acts_[L - 1].f32();
    k::dense_backward(top, vars_[2 * L].value.f32(), dlogits, dtop.f32(), grads[2 * L].value.f32(),
                      grads[2 * L + 1].value.f32(), b, h, actions_, accumulate);
    k::dense_backward(top, vars_[2 * L + 2].value.f32(), dvalues, dtop_v.f32(),
                      grads[2 * L + 2].value.f32(), grads[2 * L + 3].value.f32(), b, h, 1,
                      accumulate);
    float* d = dtop.f32();
    const float* dv = dtop_v.f32();
    for (int64_t i = 0; i < b * h; ++i) d[i] += dv[i];
    // d is the gradient w.r.t. the top activation's output: through the
    // activation, then down the torso.
    tensor dnext;
    for (std::size_t l = L; l-- > 0;) {
      auto n = static_cast<std::size_t>(acts_[l].numel());
      if (tanh_)
        k::tanh_backward(acts_[l].f32(), d, d, n);
      else
        k::relu_backward(acts_[l].f32(), d, d, n);
      const float* in = l == 0 ? obs : acts_[l - 1].f32();
      float* din = nullptr;
      if (l > 0) {
        dnext = tensor({b, widths_[l]});
        din = dnext.f32();
      }
      k::dense_backward(in, vars_[2 * l].value.f32(), d, din, grads[2 * l].value.f32(),
                        grads[2 * l + 1].value.f32(), b, widths_[l], widths_[l + 1], accumulate);
      if (l > 0) {
        dtop = std::move(dnext);
        d = dtop.f32();
      }
    }
  }

 private:
  std::size_t hidden_layers() const { return widths_.size() - 1; }

  bool tanh_;
  int64_t obs_n_, actions_;
  std::vector<int64_t> widths_;  // observation size, hidden sizes
  std::vector<named_tensor> vars_;
  std::vector<tensor> acts_;  // per hidden layer, post-activation
};

named_registry<policy_value_factory>& registry() {
  static named_registry<policy_value_factory> r{
      "policy/value model kind",
      {{"policy_value_mlp",
        [](const model_config& c, int64_t o, int64_t a, uint64_t s) {
          return std::unique_ptr<policy_value_model>(
              std::make_unique<policy_value_mlp>(c, o, a, s));
        }},
       {"policy_value_layers", &make_policy_value_layers}}};
  return r;
}

// A job config may name the built-in kinds from the start
// (register_policy_value_model adds the others).
[[maybe_unused]] const bool builtin_kinds_known = [] {
  for (const auto& kind : registry().names()) register_model_kind(kind, model_family::policy_value);
  return true;
}();

// Softmax of one row into p, returning log-sum-exp.
double softmax_row(const float* z, int64_t a, double* p) {
  const auto row = kernels::shifted_exp_row(z, a, p);
  for (int64_t j = 0; j < a; ++j) p[j] /= row.sum;
  return row.max + std::log(row.sum);
}

}  // namespace

void add_policy_value_heads(std::vector<named_tensor>& vars, int64_t hidden, int64_t actions,
                            uint64_t seed) {
  vars.push_back(
      {"policy/kernel", init_kernel(hidden, actions, "glorot", derive_seed(seed, 1000), 0.01)});
  vars.push_back({"policy/bias", tensor({actions})});
  vars.push_back({"value/kernel", init_kernel(hidden, 1, "glorot", derive_seed(seed, 1001), 1.0)});
  vars.push_back({"value/bias", tensor({1})});
}

std::vector<named_tensor> policy_value_model::make_gradients() {
  return gradients_like(variables());
}

void register_policy_value_model(const std::string& kind, policy_value_factory f) {
  registry().add(kind, std::move(f));
  register_model_kind(kind, model_family::policy_value);  // a job config may now name it
}

std::unique_ptr<policy_value_model> create_policy_value_model(const model_config& c,
                                                              int64_t observation_size,
                                                              int64_t actions, uint64_t seed) {
  auto f = registry().find(c.kind);
  if (!f)
    throw std::invalid_argument("model.kind: unknown policy/value model '" + c.kind +
                                "' (registered: " + registry().known() + ")");
  check_model_size(c, observation_size, actions + 1);  // the policy and value heads
  return f(c, observation_size, actions, seed);
}

double baseline_loss_and_gradient(double value, double target, double baseline_cost,
                                  float& dvalue) {
  const double err = value - target;
  dvalue = static_cast<float>(baseline_cost * err);
  return baseline_cost * 0.5 * err * err;
}

std::unique_ptr<policy_value_model> create_policy_value_model(const model_config& c,
                                                              int64_t observation_size,
                                                              const policy_head& head,
                                                              uint64_t seed) {
  auto net = create_policy_value_model(c, observation_size, head.actions, seed);
  if (head.distribution == action_distribution::softmax) return net;
  return make_gaussian_policy(std::move(net), head.actions, head.initial_log_std);
}

impala_loss impala_loss_and_gradients(const float* logits, const float* values,
                                      const int32_t* actions, const float* vs,
                                      const float* pg_advantages, int64_t n, int64_t num_actions,
                                      double baseline_cost, double entropy_cost, float* dlogits,
                                      float* dvalues) {
  impala_loss out;
  std::vector<double> p(static_cast<std::size_t>(num_actions));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t a = actions[t];
    if (a < 0 || a >= num_actions)
      throw std::out_of_range("impala loss: action " + std::to_string(a) + " at step " +
                              std::to_string(t) + " is out of range [0, " +
                              std::to_string(num_actions) + ")");
    const float* z = logits + t * num_actions;
    const double lse = softmax_row(z, num_actions, p.data());
    double h = 0;  // entropy
    for (int64_t j = 0; j < num_actions; ++j)
      if (p[static_cast<std::size_t>(j)] > 0)
        h -= p[static_cast<std::size_t>(j)] * (static_cast<double>(z[j]) - lse);
    const double adv = pg_advantages[t];
    const double logp_a = static_cast<double>(z[a]) - lse;
    out.policy -= adv * logp_a;
    out.entropy += h;
    out.baseline += baseline_loss_and_gradient(values[t], vs[t], baseline_cost, dvalues[t]);
    for (int64_t j = 0; j < num_actions; ++j) {
      const double pj = p[static_cast<std::size_t>(j)];
      const double logp = static_cast<double>(z[j]) - lse;
      // d(-adv log p_a)/dz_j = -adv (1[j = a] - p_j);
      // d(-c H)/dz_j = c p_j (log p_j + H).
      const double g = -adv * ((j == a ? 1.0 : 0.0) - pj) + entropy_cost * pj * (logp + h);
      dlogits[t * num_actions + j] = static_cast<float>(g);
    }
  }
  out.total = out.policy + out.baseline - entropy_cost * out.entropy;
  return out;
}

void action_log_probs(const float* logits, const int32_t* actions, int64_t n, int64_t num_actions,
                      float* out) {
  std::vector<double> p(static_cast<std::size_t>(num_actions));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t a = actions[t];
    if (a < 0 || a >= num_actions)
      throw std::out_of_range("action " + std::to_string(a) + " at step " + std::to_string(t) +
                              " is out of range [0, " + std::to_string(num_actions) + ")");
    const float* z = logits + t * num_actions;
    const double lse = softmax_row(z, num_actions, p.data());
    out[t] = static_cast<float>(static_cast<double>(z[a]) - lse);
  }
}

}  // namespace troupe
