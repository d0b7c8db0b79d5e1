#include "models/mlp.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <stdexcept>

#include "devices/device_context.hpp"
#include "models/random.hpp"

namespace troupe {
namespace {

// Written once against the backend (kernels/backend.hpp), so it computes on
// whichever device its context is: on cpu:N every buffer is a host tensor
// used in place, exactly as before devices had memory of their own; on a
// discrete device (sim:N, cuda:N) the variables, gradients (one contiguous
// block, for fused collectives), activations and batch live in the device's
// memory and variables() is a host staging copy.
class mlp final : public model {
 public:
  mlp(const model_config& c, const model_shape& s, uint64_t seed,
      std::shared_ptr<device_context> ctx)
      : act_(c.activation == "tanh" ? kernels::activation::tanh : kernels::activation::relu),
        ctx_(ctx ? std::move(ctx) : make_device_context(device_spec{})),
        ops_(ctx_->ops()),
        resident_(!ctx_->shares_host_memory()) {
    if (c.activation != "relu" && c.activation != "tanh")
      throw std::invalid_argument("model.activation: expected \"relu\" or \"tanh\", got \"" +
                                  c.activation + "\"");
    if (s.features <= 0 || s.classes <= 0)
      throw std::invalid_argument("mlp: features and classes must be positive");
    std::string init =
        c.init == "auto" ? (act_ == kernels::activation::tanh ? "glorot" : "he") : c.init;
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
    if (resident_) place_on_device();
  }

  std::vector<named_tensor>& variables() override { return vars_; }
  bool device_resident() const override { return resident_; }
  device_context* device() override { return ctx_.get(); }

  void variables_to_host() override {
    if (!resident_) return;
    for (std::size_t i = 0; i < vars_.size(); ++i)
      ctx_->copy_to_host(vars_[i].value.raw(), dvars_[i].data(), vars_[i].value.nbytes());
  }
  void variables_to_device() override {
    if (!resident_) return;
    for (std::size_t i = 0; i < vars_.size(); ++i)
      ctx_->copy_to_device(dvars_[i].data(), vars_[i].value.raw(), vars_[i].value.nbytes());
  }
  void gradients_to_host(std::vector<named_tensor>& grads) override {
    if (!resident_) return;
    check_grads(grads);
    for (std::size_t i = 0; i < grads.size(); ++i)
      ctx_->copy_to_host(grads[i].value.raw(), dgrad(i), grads[i].value.nbytes());
  }
  void gradients_to_device(const std::vector<named_tensor>& grads) override {
    if (!resident_) return;
    check_grads(grads);
    for (std::size_t i = 0; i < grads.size(); ++i)
      ctx_->copy_to_device(dgrad(i), grads[i].value.raw(), grads[i].value.nbytes());
  }
  void prefetch(const tensor& x, const tensor& y) override {
    if (!resident_ || x.empty()) return;
    check_batch(x, y);
    check_labels(y);
    staged_batch s{x, y, ctx_->allocate(x.nbytes()), ctx_->allocate(y.nbytes()), {}, {}};
    s.x_done = ctx_->upload_async(s.dx.data(), x.raw(), x.nbytes());
    s.y_done = ctx_->upload_async(s.dy.data(), y.raw(), y.nbytes());
    staged_.push_back(std::move(s));
    if (staged_.size() > kMaxStaged) staged_.pop_front();  // never asked for
  }
  std::vector<float*> device_variables() override {
    std::vector<float*> out;
    for (std::size_t i = 0; i < vars_.size(); ++i) out.push_back(var(i));
    return out;
  }
  std::vector<float*> device_gradients() override {
    std::vector<float*> out;
    for (std::size_t i = 0; i < vars_.size(); ++i) out.push_back(dgrad(i));
    return out;
  }
  float* device_gradient_block() override { return resident_ ? dgrads_.f32() : nullptr; }

  batch_stats train_batch(const tensor& x, const tensor& y, float grad_scale,
                          std::vector<named_tensor>& grads, bool accumulate) override {
    check_batch(x, y);
    if (!resident_) {
      check_grads(grads);
      host_grads_ = &grads;
    }
    const int64_t b = x.dim(0);
    batch_stats st;
    st.count = b;
    if (b == 0) {
      if (!accumulate)
        for (std::size_t i = 0; i < vars_.size(); ++i)
          ops_.fill(dgrad(i), 0.0f, static_cast<std::size_t>(vars_[i].value.numel()));
      return st;
    }
    const float* xin = stage_batch(x, y);
    forward(xin, b);
    const std::size_t L = layers();
    // Gradient buffers for training batches only: evaluation's larger
    // chunks need none.
    for (std::size_t l = 0; l < L; ++l) {
      const auto bytes = static_cast<std::size_t>(b * widths_[l + 1]) * sizeof(float);
      if (dacts_[l].bytes() < bytes) dacts_[l] = ctx_->allocate(bytes);
    }
    stats_begin();
    ops_.softmax_cross_entropy(acts_[L - 1].f32(), labels(y), b, widths_[L], grad_scale,
                               dacts_[L - 1].f32(), loss_ptr(), correct_ptr());
    // Each bias gradient comes out of the pass that makes its layer's output
    // gradient (the top one's: the logits' gradient, no activation), so no
    // layer reads its gradient a second time for it.
    ops_.activation_backward_bias(kernels::activation::none, nullptr, dacts_[L - 1].f32(),
                                  dacts_[L - 1].f32(), dgrad(2 * L - 1), b, widths_[L], accumulate);
    for (std::size_t l = L; l-- > 0;) {
      const float* in = l == 0 ? xin : acts_[l - 1].f32();
      float* din = l == 0 ? nullptr : dacts_[l - 1].f32();
      ops_.dense_backward(in, var(2 * l), dacts_[l].f32(), din, dgrad(2 * l), nullptr, b,
                          widths_[l], widths_[l + 1], accumulate);
      if (l > 0)
        ops_.activation_backward_bias(act_, acts_[l - 1].f32(), din, din, dgrad(2 * l - 1), b,
                                      widths_[l], accumulate);
      gradients_ready(2 * l, 2 * l + 2);  // this layer's kernel and bias
    }
    stats_end(st);
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
      tensor yc({b}, dtype::i32);
      std::copy(y.data<int32_t>() + s, y.data<int32_t>() + s + b, yc.data<int32_t>());
      const float* xin = stage_batch(xc, yc);
      forward(xin, b);
      stats_begin();
      ops_.softmax_cross_entropy(acts_[layers() - 1].f32(), labels(yc), b, widths_.back(), 0.0f,
                                 nullptr, loss_ptr(), correct_ptr());
      batch_stats part;
      stats_end(part);
      st.loss_sum += part.loss_sum;
      st.correct += part.correct;
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
  void check_grads(const std::vector<named_tensor>& grads) const {
    if (grads.size() != vars_.size()) throw std::invalid_argument("mlp: wrong gradient count");
  }

  // Device copies of the variables and one block for all gradients.
  void place_on_device() {
    int64_t total = 0;
    for (auto& v : vars_) {
      grad_offsets_.push_back(total);
      total += v.value.numel();
      dvars_.push_back(ctx_->allocate(v.value.nbytes()));
    }
    dgrads_ = ctx_->allocate(static_cast<std::size_t>(total) * sizeof(float));
    ops_.fill(dgrads_.f32(), 0.0f, static_cast<std::size_t>(total));
    dstats_ = ctx_->allocate(sizeof(double) + sizeof(int64_t));
    variables_to_device();
  }

  float* var(std::size_t i) { return resident_ ? dvars_[i].f32() : vars_[i].value.f32(); }
  float* dgrad(std::size_t i) {
    if (resident_) return dgrads_.f32() + grad_offsets_[i];
    if (!host_grads_) throw std::logic_error("mlp: no gradients before the first train_batch");
    return (*host_grads_)[i].value.f32();
  }

  // The batch where the device reads it: the caller's tensors on cpu:N;
  // else an upload (labels checked on the host first: a device cannot throw).
  const float* stage_batch(const tensor& x, const tensor& y) {
    if (!resident_) return x.f32();
    check_labels(y);
    for (auto i = staged_.begin(); i != staged_.end(); ++i) {
      if (!i->x.shares_buffer_with(x) || !i->y.shares_buffer_with(y)) continue;
      ctx_->wait(i->x_done);
      ctx_->wait(i->y_done);
      // Kept until the next batch: dropping an event whose copy is still on
      // its way blocks this thread until it lands (it owns a staging block).
      waited_ = {std::move(i->x_done), std::move(i->y_done)};
      dx_ = std::move(i->dx);
      dy_ = std::move(i->dy);
      staged_.erase(i);
      return dx_.f32();
    }
    if (dx_.bytes() < x.nbytes()) dx_ = ctx_->allocate(x.nbytes());
    if (dy_.bytes() < y.nbytes()) dy_ = ctx_->allocate(y.nbytes());
    // Not prefetched: on the compute stream, behind the work before it (an
    // upload on the copy stream would wait for that work and block here).
    ctx_->copy_to_device(dx_.data(), x.raw(), x.nbytes());
    ctx_->copy_to_device(dy_.data(), y.raw(), y.nbytes());
    return dx_.f32();
  }
  // On the host: a device cannot throw.
  void check_labels(const tensor& y) const {
    const auto* lab = y.data<int32_t>();
    for (int64_t i = 0; i < y.numel(); ++i)
      if (lab[i] < 0 || lab[i] >= widths_.back())
        throw std::out_of_range("softmax_cross_entropy: label " + std::to_string(lab[i]) +
                                " at row " + std::to_string(i) + " outside [0, " +
                                std::to_string(widths_.back()) + ")");
  }
  const int32_t* labels(const tensor& y) const {
    return resident_ ? dy_.as<int32_t>() : y.data<int32_t>();
  }

  double* loss_ptr() { return resident_ ? dstats_.as<double>() : &host_loss_; }
  int64_t* correct_ptr() {
    return resident_ ? reinterpret_cast<int64_t*>(dstats_.as<unsigned char>() + sizeof(double))
                     : &host_correct_;
  }
  void stats_begin() { ops_.fill_stats(loss_ptr(), correct_ptr()); }
  void stats_end(batch_stats& st) {
    if (resident_) {
      unsigned char raw[sizeof(double) + sizeof(int64_t)];
      ctx_->copy_to_host(raw, dstats_.data(), sizeof raw);
      std::memcpy(&host_loss_, raw, sizeof(double));
      std::memcpy(&host_correct_, raw + sizeof(double), sizeof(int64_t));
    }
    st.loss_sum = host_loss_;
    st.correct += host_correct_;
  }

  void forward(const float* x, int64_t b) {
    for (std::size_t l = 0; l < layers(); ++l) {
      const auto bytes = static_cast<std::size_t>(b * widths_[l + 1]) * sizeof(float);
      if (acts_[l].bytes() < bytes) acts_[l] = ctx_->allocate(bytes);
      const float* in = l == 0 ? x : acts_[l - 1].f32();
      ops_.dense_forward(in, var(2 * l), var(2 * l + 1), acts_[l].f32(), b, widths_[l],
                         widths_[l + 1], l + 1 < layers() ? act_ : kernels::activation::none);
    }
  }

  kernels::activation act_;
  std::shared_ptr<device_context> ctx_;
  kernels::backend& ops_;
  bool resident_;
  std::vector<int64_t> widths_;
  std::vector<named_tensor> vars_;    // on a discrete device: host staging
  std::vector<device_buffer> acts_;   // per layer output (post-activation; logits last)
  std::vector<device_buffer> dacts_;  // gradient w.r.t. each layer's pre-activation output
  std::vector<named_tensor>* host_grads_ = nullptr;  // cpu:N: the caller's, in place
  double host_loss_ = 0;
  int64_t host_correct_ = 0;
  // Discrete devices only.
  std::vector<device_buffer> dvars_;
  device_buffer dgrads_;
  std::vector<int64_t> grad_offsets_;
  device_buffer dx_, dy_, dstats_;
  // Batches prefetched by prefetch(), matched to train_batch by buffer.
  struct staged_batch {
    tensor x, y;  // held: their buffers identify the batch
    device_buffer dx, dy;
    std::shared_ptr<device_event> x_done, y_done;
  };
  static constexpr std::size_t kMaxStaged = 8;
  std::deque<staged_batch> staged_;
  std::pair<std::shared_ptr<device_event>, std::shared_ptr<device_event>> waited_;
};

}  // namespace

std::unique_ptr<model> make_mlp(const model_config& c, const model_shape& s, uint64_t seed) {
  return std::make_unique<mlp>(c, s, seed, nullptr);
}

std::unique_ptr<model> make_mlp_on(const model_config& c, const model_shape& s, uint64_t seed,
                                   std::shared_ptr<device_context> ctx) {
  return std::make_unique<mlp>(c, s, seed, std::move(ctx));
}

}  // namespace troupe
