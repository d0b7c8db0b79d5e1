#include "models/mlp.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu_kernels.hpp"
#include "models/random.hpp"

namespace troupe {
namespace {

namespace k = troupe::kernels;

class mlp final : public model {
 public:
  mlp(const model_config& c, const model_shape& s, uint64_t seed) : tanh_(c.activation == "tanh") {
    if (c.activation != "relu" && c.activation != "tanh")
      throw std::invalid_argument("model.activation: expected \"relu\" or \"tanh\", got \"" +
                                  c.activation + "\"");
    if (s.features <= 0 || s.classes <= 0)
      throw std::invalid_argument("mlp: features and classes must be positive");
    std::string init = c.init == "auto" ? (tanh_ ? "glorot" : "he") : c.init;
    widths_.push_back(s.features);
    for (auto h : c.hidden) widths_.push_back(h);
    widths_.push_back(s.classes);
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      int64_t in = widths_[l], out = widths_[l + 1];
      tensor w({in, out});
      splitmix64 g(derive_seed(seed, l));
      float* p = w.f32();
      if (init == "he") {
        double sd = std::sqrt(2.0 / static_cast<double>(in));
        for (int64_t i = 0; i < in * out; ++i) p[i] = static_cast<float>(g.normal() * sd);
      } else if (init == "glorot") {
        double a = std::sqrt(6.0 / static_cast<double>(in + out));
        for (int64_t i = 0; i < in * out; ++i) p[i] = static_cast<float>((2 * g.uniform() - 1) * a);
      } else {
        throw std::invalid_argument("model.init: expected \"auto\", \"he\" or \"glorot\", got \"" +
                                    c.init + "\"");
      }
      vars_.push_back({"dense_" + std::to_string(l) + "/kernel", w});
      vars_.push_back({"dense_" + std::to_string(l) + "/bias", tensor({out})});
    }
    acts_.resize(layers());
    dacts_.resize(layers());
  }

  std::vector<named_tensor>& variables() override { return vars_; }

  batch_stats train_batch(const tensor& x, const tensor& y, float grad_scale,
                          std::vector<named_tensor>& grads, bool accumulate) override {
    check_batch(x, y);
    if (grads.size() != vars_.size()) throw std::invalid_argument("mlp: wrong gradient count");
    const int64_t b = x.dim(0);
    batch_stats st;
    st.count = b;
    if (b == 0) {
      if (!accumulate)
        for (auto& g : grads) g.value.fill(0.0f);
      return st;
    }
    forward(x, b);
    const std::size_t L = layers();
    tensor& logits = acts_[L - 1];
    tensor& dlogits = dacts_[L - 1];
    st.loss_sum = k::softmax_cross_entropy(logits.f32(), y.data<int32_t>(), b, widths_[L],
                                           grad_scale, dlogits.f32(), &st.correct);
    for (std::size_t l = L; l-- > 0;) {
      const float* in = l == 0 ? x.f32() : acts_[l - 1].f32();
      float* din = l == 0 ? nullptr : dacts_[l - 1].f32();
      k::dense_backward(in, vars_[2 * l].value.f32(), dacts_[l].f32(), din,
                        grads[2 * l].value.f32(), grads[2 * l + 1].value.f32(), b, widths_[l],
                        widths_[l + 1], accumulate);
      if (l > 0) {
        auto n = static_cast<std::size_t>(acts_[l - 1].numel());
        if (tanh_)
          k::tanh_backward(acts_[l - 1].f32(), din, din, n);
        else
          k::relu_backward(acts_[l - 1].f32(), din, din, n);
      }
    }
    return st;
  }

  batch_stats evaluate(const tensor& x, const tensor& y) override {
    check_batch(x, y);
    batch_stats st;
    const int64_t n = x.dim(0);
    const int64_t chunk = 1024;
    const int64_t f = widths_.front();
    for (int64_t s = 0; s < n; s += chunk) {
      int64_t b = std::min(chunk, n - s);
      // Views into the caller's tensors would need offsets; copy the chunk.
      tensor xc({b, f});
      std::copy(x.f32() + s * f, x.f32() + (s + b) * f, xc.f32());
      forward(xc, b);
      st.loss_sum += k::softmax_cross_entropy(acts_[layers() - 1].f32(), y.data<int32_t>() + s, b,
                                              widths_.back(), 0.0f, nullptr, &st.correct);
      st.count += b;
    }
    return st;
  }

 private:
  std::size_t layers() const { return widths_.size() - 1; }

  void check_batch(const tensor& x, const tensor& y) const {
    if (x.rank() != 2 || x.dim(1) != widths_.front() || y.rank() != 1 || y.dim(0) != x.dim(0))
      throw std::invalid_argument("mlp: batch of shape " + shape_string(x.shape()) + " / " +
                                  shape_string(y.shape()) + " does not fit features " +
                                  std::to_string(widths_.front()));
  }

  void forward(const tensor& x, int64_t b) {
    for (std::size_t l = 0; l < layers(); ++l) {
      shape_t s{b, widths_[l + 1]};
      if (acts_[l].shape() != s) {
        acts_[l] = tensor(s);
        dacts_[l] = tensor(s);
      }
      const float* in = l == 0 ? x.f32() : acts_[l - 1].f32();
      k::dense_forward(in, vars_[2 * l].value.f32(), vars_[2 * l + 1].value.f32(), acts_[l].f32(),
                       b, widths_[l], widths_[l + 1]);
      if (l + 1 < layers()) {
        auto n = static_cast<std::size_t>(acts_[l].numel());
        if (tanh_)
          k::tanh_forward(acts_[l].f32(), acts_[l].f32(), n);
        else
          k::relu_forward(acts_[l].f32(), acts_[l].f32(), n);
      }
    }
  }

  bool tanh_;
  std::vector<int64_t> widths_;
  std::vector<named_tensor> vars_;
  std::vector<tensor> acts_;   // per layer output (post-activation; logits last)
  std::vector<tensor> dacts_;  // gradient w.r.t. each layer's pre-activation output
};

}  // namespace

std::unique_ptr<model> make_mlp(const model_config& c, const model_shape& s, uint64_t seed) {
  return std::make_unique<mlp>(c, s, seed);
}

}  // namespace troupe
