// policy_value_layers: the actor/learner's network with its torso any layer
// stack (model.layers over the observation, ending in a [features] vector),
// and the same two heads as policy_value_mlp: policy logits and a value.
// Runs on the host, through the CPU backend, like the MLP it generalises.
#include "config/json_read.hpp"
#include "devices/device_context.hpp"
#include "models/layers/stack.hpp"
#include "models/policy_value.hpp"

namespace troupe {
namespace {

class policy_value_layers final : public policy_value_model {
 public:
  policy_value_layers(const model_config& c, int64_t obs_n, int64_t actions, uint64_t seed)
      : ctx_(make_device_context(device_spec{})), obs_n_(obs_n), actions_(actions) {
    if (obs_n <= 0 || actions <= 0)
      throw std::invalid_argument("policy_value_layers: observation size and actions must be > 0");
    layers::build_context bc;
    bc.seed = seed;
    bc.vars = &vars_;
    bc.buffers = &bufs_;
    torso_ =
        std::make_unique<layers::layer_stack>(c.layers, "model.layers", layers::shape{obs_n}, bc);
    if (torso_->output().size() != 1)
      json_read::fail("model.layers", "the torso must end in a [features] vector (flatten), got " +
                                          layers::describe(torso_->output()));
    if (!bufs_.empty())
      json_read::fail("model.layers",
                      "batch_norm has no place in an actor/learner torso: its "
                      "statistics would differ between actors and learner");
    h_ = torso_->output()[0];
    heads_ = vars_.size();
    add_policy_value_heads(vars_, h_, actions, seed);
  }

  std::vector<named_tensor>& variables() override { return vars_; }
  int64_t input_size() override { return obs_n_; }

  void forward(const float* obs, int64_t b, float* logits, float* values) override {
    auto rc = context(b, nullptr, false);
    top_ = torso_->forward(rc, obs);
    batch_ = b;
    auto& ops = *rc.ops;
    ops.dense_forward(top_, vars_[heads_].value.f32(), vars_[heads_ + 1].value.f32(), logits, b, h_,
                      actions_, kernels::activation::none);
    ops.dense_forward(top_, vars_[heads_ + 2].value.f32(), vars_[heads_ + 3].value.f32(), values, b,
                      h_, 1, kernels::activation::none);
  }

  void backward(const float* obs, int64_t b, const float* dlogits, const float* dvalues,
                std::vector<named_tensor>& grads, bool accumulate) override {
    if (grads.size() != vars_.size())
      throw std::invalid_argument("policy_value_layers: wrong gradient count");
    if (b != batch_ || !top_)
      throw std::logic_error("policy_value_layers: backward without a forward on this batch");
    auto rc = context(b, &grads, accumulate);
    auto& ops = *rc.ops;
    tensor dtop({b, h_}), dtop_v({b, h_});
    ops.dense_backward(top_, vars_[heads_].value.f32(), dlogits, dtop.f32(),
                       grads[heads_].value.f32(), grads[heads_ + 1].value.f32(), b, h_, actions_,
                       accumulate);
    ops.dense_backward(top_, vars_[heads_ + 2].value.f32(), dvalues, dtop_v.f32(),
                       grads[heads_ + 2].value.f32(), grads[heads_ + 3].value.f32(), b, h_, 1,
                       accumulate);
    ops.add_inplace(dtop.f32(), dtop_v.f32(), static_cast<std::size_t>(b * h_));
    torso_->backward(rc, obs, dtop.f32(), nullptr, nullptr);
  }

 private:
  layers::run_context context(int64_t b, std::vector<named_tensor>* grads, bool accumulate) {
    layers::run_context rc;
    rc.ops = &ctx_->ops();
    rc.dev = ctx_.get();
    rc.batch = b;
    rc.training = grads != nullptr;
    rc.accumulate = accumulate;
    for (auto& v : vars_) rc.vars.push_back(v.value.f32());
    if (grads)
      for (auto& g : *grads) rc.grads.push_back(g.value.f32());
    return rc;
  }

  std::shared_ptr<device_context> ctx_;
  int64_t obs_n_;
  int64_t actions_;
  int64_t h_ = 0;
  std::size_t heads_ = 0;
  std::vector<named_tensor> vars_, bufs_;
  std::unique_ptr<layers::layer_stack> torso_;
  const float* top_ = nullptr;
  int64_t batch_ = -1;
};

}  // namespace

std::unique_ptr<policy_value_model> make_policy_value_layers(const model_config& c,
                                                             int64_t observation_size,
                                                             int64_t actions, uint64_t seed) {
  return std::make_unique<policy_value_layers>(c, observation_size, actions, seed);
}

}  // namespace troupe
