#include "models/layer_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <stdexcept>

#include "config/json_read.hpp"
#include "devices/device_context.hpp"
#include "models/layers/keys.hpp"
#include "models/layers/stack.hpp"
#include "models/random.hpp"

namespace troupe {
namespace {

enum class loss_kind { softmax_cross_entropy, binary_cross_entropy, mse };

loss_kind loss_of(const model_config& c) {
  if (c.loss == "binary_cross_entropy") return loss_kind::binary_cross_entropy;
  if (c.loss == "mse") return loss_kind::mse;
  if (c.loss == "softmax_cross_entropy") return loss_kind::softmax_cross_entropy;
  json_read::expected("model.loss",
                      "one of \"softmax_cross_entropy\", \"binary_cross_entropy\", \"mse\"",
                      nlohmann::json(c.loss));
}

layers::shape input_of(const model_shape& s) {
  if (s.input.empty()) return {s.features};
  if (layers::numel(s.input) != s.features)
    throw std::invalid_argument("model: input shape " + layers::describe(s.input) + " is not " +
                                std::to_string(s.features) + " values");
  return s.input;
}

// What the loss compares the last layer's output with: class labels (one
// output per class) or float targets (one output per target).
int64_t outputs_for(loss_kind loss, const model_shape& s) {
  if (loss == loss_kind::softmax_cross_entropy) return s.classes;
  return s.targets > 0 ? s.targets : (s.classes == 2 ? 1 : s.classes);
}

// The network of a config, built over an input: its layers, variables,
// buffers, and what the model needs to know of them.
struct network {
  std::vector<named_tensor> vars, bufs;
  std::unique_ptr<layers::layer_stack> stack;
  loss_kind loss = loss_kind::softmax_cross_entropy;
  int64_t outputs = 0;
  int64_t vocab = 0;  // the first layer is an embedding of this many ids
  bool synced = false;
  bool dropout = false;  // the rows' ids are staged for the masks

  network(const model_config& c, const model_shape& s, uint64_t seed, bool dry_run = false) {
    loss = loss_of(c);
    if (!c.layers.is_array()) json_read::expected("model.layers", "an array of layers", c.layers);
    layers::build_context bc;
    bc.seed = seed;
    bc.dry_run = dry_run;
    bc.vars = &vars;
    bc.buffers = &bufs;
    stack = std::make_unique<layers::layer_stack>(c.layers, "model.layers", input_of(s), bc);
    synced = bc.sync_batch_norm;
    dropout = bc.dropout_layers > 0;
    outputs = outputs_for(loss, s);
    const auto& out = stack->output();
    if (out.size() != 1 || out[0] != outputs)
      json_read::fail("model.layers",
                      "the last layer gives " + layers::describe(out) + " but the loss (" + c.loss +
                          ") needs [" + std::to_string(outputs) + "]" +
                          (loss == loss_kind::softmax_cross_entropy ? ": one logit per class"
                                                                    : ": one output per target"));
    if (layers::type_of(&c.layers[0]) == "embedding")
      vocab = c.layers[0].at("vocab").get<int64_t>();
    parameters = bc.parameters;
  }
  int64_t parameters = 0;
};

class layer_model final : public model {
 public:
  layer_model(const model_config& c, const model_shape& s, uint64_t seed,
              std::shared_ptr<device_context> ctx)
      : net_(c, s, seed),
        ctx_(ctx ? std::move(ctx) : make_device_context(device_spec{})),
        resident_(!ctx_->shares_host_memory()),
        seed_(seed),
        features_(s.features) {
    buffers_ = std::move(net_.bufs);
    if (resident_) place_on_device();
  }

  std::vector<named_tensor>& variables() override { return net_.vars; }
  bool device_resident() const override { return resident_; }
  device_context* device() override { return ctx_.get(); }
  bool synced_statistics() const override { return net_.synced; }
  void set_statistics_group(process_group* group) override { group_ = group; }
  void set_step(int64_t step, const tensor* ids) override {
    step_ = step;
    ids_ = ids ? *ids : tensor{};
  }

  void variables_to_host() override {
    if (!resident_) return;
    for (std::size_t i = 0; i < net_.vars.size(); ++i)
      ctx_->copy_to_host(net_.vars[i].value.raw(), dvars_[i].data(), net_.vars[i].value.nbytes());
    for (std::size_t i = 0; i < buffers_.size(); ++i)
      ctx_->copy_to_host(buffers_[i].value.raw(), dbufs_[i].data(), buffers_[i].value.nbytes());
  }
  void variables_to_device() override {
    if (!resident_) return;
    for (std::size_t i = 0; i < net_.vars.size(); ++i)
      ctx_->copy_to_device(dvars_[i].data(), net_.vars[i].value.raw(), net_.vars[i].value.nbytes());
    for (std::size_t i = 0; i < buffers_.size(); ++i)
      ctx_->copy_to_device(dbufs_[i].data(), buffers_[i].value.raw(), buffers_[i].value.nbytes());
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
    check_inputs(x, y);
    staged_batch s{x, y, ctx_->allocate(x.nbytes()), ctx_->allocate(y.nbytes()), {}, {}};
    s.x_done = ctx_->upload_async(s.dx.data(), x.raw(), x.nbytes());
    s.y_done = ctx_->upload_async(s.dy.data(), y.raw(), y.nbytes());
    staged_.push_back(std::move(s));
    if (staged_.size() > kMaxStaged) staged_.pop_front();  // never asked for
  }
  std::vector<float*> device_variables() override {
    std::vector<float*> out;
    for (std::size_t i = 0; i < net_.vars.size(); ++i) out.push_back(var(i));
    return out;
  }
  std::vector<float*> device_gradients() override {
    std::vector<float*> out;
    for (std::size_t i = 0; i < net_.vars.size(); ++i) out.push_back(dgrad(i));
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
        for (std::size_t i = 0; i < net_.vars.size(); ++i)
          ops().fill(dgrad(i), 0.0f, static_cast<std::size_t>(net_.vars[i].value.numel()));
      if (net_.synced && group_) {
        auto rc = context(0, true, accumulate);
        net_.stack->idle_forward(rc);
        net_.stack->idle_backward(rc);
      }
      return st;
    }
    const float* xin = stage_batch(x, y);
    auto rc = context(b, true, accumulate);
    if (net_.dropout) stage_ids(rc, b);
    forward_loss_backward(rc, xin, label_ptr(y), b, grad_scale, true);
    stats_end(st);
    return st;
  }

  bool attach_dataset(const tensor& images, const tensor& labels) override {
    if (!resident_) return false;
    check_batch(images, labels);
    check_inputs(images, labels);
    dimages_ = ctx_->allocate(images.nbytes());
    dlabels_ = ctx_->allocate(labels.nbytes());
    ctx_->copy_to_device(dimages_.data(), images.raw(), images.nbytes());
    ctx_->copy_to_device(dlabels_.data(), labels.raw(), labels.nbytes());
    label_words_ = labels.numel() / std::max<int64_t>(labels.dim(0), 1);
    return true;
  }
  void train_planned(const int64_t* plan, const int64_t* counter, int64_t rows,
                     float grad_scale) override {
    if (!dimages_) model::train_planned(plan, counter, rows, grad_scale);
    // Buffers of its own: the host path's are replaced as batches come.
    grow(planned_x_, static_cast<std::size_t>(rows * features_) * sizeof(float));
    grow(planned_y_, static_cast<std::size_t>(rows * label_words_) * 4);
    grow(planned_ids_, static_cast<std::size_t>(rows) * sizeof(int64_t));
    ops().gather_planned_rows({dimages_.data(), features_, planned_x_.data()},
                              {dlabels_.data(), label_words_, planned_y_.data()}, plan, counter,
                              rows, planned_ids_.as<int64_t>());
    auto rc = context(rows, true, false);
    rc.example_ids = planned_ids_.as<int64_t>();
    rc.step_counter = counter;
    forward_loss_backward(rc, planned_x_.f32(), planned_y_.data(), rows, grad_scale, false);
  }
  std::pair<double*, int64_t*> device_stats() override { return {loss_ptr(), correct_ptr()}; }
  bool capturable(std::string* why) const override {
    const char* no = nullptr;
    if (!resident_)
      no = "the model computes on the host";
    else if (net_.synced && group_)
      no = "synchronised batch norm all-reduces with its peers";
    if (no && why) *why = no;
    return no == nullptr;
  }

  batch_stats evaluate(const tensor& x, const tensor& y) override {
    check_batch(x, y);
    batch_stats st;
    const int64_t n = x.dim(0);
    const int64_t chunk = 1024;
    const int64_t f = features_;
    const int64_t yw = y.numel() / std::max<int64_t>(n, 1);
    for (int64_t s = 0; s < n; s += chunk) {
      int64_t b = std::min(chunk, n - s);
      // Views into the caller's tensors would need offsets; copy the chunk.
      tensor xc({b, f});
      std::copy(x.f32() + s * f, x.f32() + (s + b) * f, xc.f32());
      auto yshape = y.shape();
      yshape[0] = b;
      tensor yc(yshape, y.type());
      std::memcpy(yc.raw(), static_cast<const char*>(y.raw()) + s * yw * dtype_size(y.type()),
                  yc.nbytes());
      const float* xin = stage_batch(xc, yc);
      auto rc = context(b, false, false);
      const float* out = net_.stack->forward(rc, xin);
      stats_begin();
      loss(out, label_ptr(yc), b, 0.0f, nullptr);
      batch_stats part;
      stats_end(part);
      st.loss_sum += part.loss_sum;
      st.correct += part.correct;
      st.count += b;
    }
    return st;
  }

 private:
  // The device's backend now: while a step is captured, the recorder's.
  kernels::backend& ops() { return ctx_->ops(); }
  layers::run_context context(int64_t b, bool training, bool accumulate) {
    layers::run_context rc;
    rc.ops = &ops();
    rc.dev = ctx_.get();
    rc.batch = b;
    rc.training = training;
    rc.accumulate = accumulate;
    rc.sync = group_;
    rc.base_seed = seed_ ^ 0x6a09e667f3bcc909ULL;
    rc.step_seed = derive_seed(rc.base_seed, static_cast<uint64_t>(step_));
    rc.vars = device_variables();
    if (training) rc.grads = device_gradients();
    for (std::size_t i = 0; i < buffers_.size(); ++i) rc.bufs.push_back(buf(i));
    return rc;
  }

  // The ids of the rows, where the device reads them (dropout's masks).
  void stage_ids(layers::run_context& rc, int64_t b) {
    const bool given = !ids_.empty() && ids_.type() == dtype::i64 && ids_.numel() == b;
    tensor ids = given ? ids_ : tensor({b}, dtype::i64);
    if (!given)
      for (int64_t i = 0; i < b; ++i) ids.data<int64_t>()[i] = i;
    if (!resident_) {
      host_ids_ = ids;
      rc.example_ids = host_ids_.data<int64_t>();
      return;
    }
    if (dids_.bytes() < ids.nbytes()) dids_ = ctx_->allocate(ids.nbytes());
    ctx_->copy_to_device(dids_.data(), ids.raw(), ids.nbytes());
    rc.example_ids = dids_.as<int64_t>();
  }

  // Forward, loss (its sums added to the stats, zeroed first with
  // zero_stats) and backward of b rows at xin with their labels at
  // `labels`, both where the device reads them.
  void forward_loss_backward(layers::run_context& rc, const float* xin, const void* labels,
                             int64_t b, float grad_scale, bool zero_stats) {
    const float* out = net_.stack->forward(rc, xin);
    grow(dout_, static_cast<std::size_t>(std::max<int64_t>(b, 1) * net_.outputs) * sizeof(float));
    if (zero_stats) stats_begin();
    loss(out, labels, b, grad_scale, dout_.f32());
    net_.stack->backward(
        rc, xin, dout_.f32(), nullptr,
        [this](std::size_t first, std::size_t last) { gradients_ready(first, last); });
  }
  void grow(device_buffer& b, std::size_t bytes) {
    if (b.bytes() < bytes) b = ctx_->allocate(bytes);
  }

  void loss(const float* out, const void* labels, int64_t b, float grad_scale, float* dout) {
    const auto* targets = static_cast<const float*>(labels);
    switch (net_.loss) {
      case loss_kind::softmax_cross_entropy:
        ops().softmax_cross_entropy(out, static_cast<const int32_t*>(labels), b, net_.outputs,
                                    grad_scale, dout, loss_ptr(), correct_ptr());
        break;
      case loss_kind::binary_cross_entropy:
        ops().sigmoid_cross_entropy(out, targets, b, net_.outputs, grad_scale, dout, loss_ptr(),
                                    correct_ptr());
        break;
      case loss_kind::mse:
        ops().mean_squared_error(out, targets, b, net_.outputs, grad_scale, dout, loss_ptr());
        break;
    }
  }

  bool class_labels() const { return net_.loss == loss_kind::softmax_cross_entropy; }

  void check_batch(const tensor& x, const tensor& y) const {
    bool ok = x.rank() == 2 && x.dim(1) == features_ && y.rank() >= 1 && y.dim(0) == x.dim(0);
    if (ok && class_labels()) ok = y.rank() == 1 && y.type() == dtype::i32;
    if (ok && !class_labels()) ok = y.type() == dtype::f32 && y.numel() == x.dim(0) * net_.outputs;
    if (!ok)
      throw std::invalid_argument(
          "model: batch of shape " + shape_string(x.shape()) + " / " + shape_string(y.shape()) +
          " does not fit features " + std::to_string(features_) + " and " +
          (class_labels() ? "int32 class labels [b]"
                          : "float32 targets [b, " + std::to_string(net_.outputs) + "]"));
  }
  void check_grads(const std::vector<named_tensor>& grads) const {
    if (grads.size() != net_.vars.size())
      throw std::invalid_argument("model: wrong gradient count");
  }

  // On the host: a device cannot throw.
  void check_inputs(const tensor& x, const tensor& y) const {
    if (class_labels()) {
      const auto* lab = y.data<int32_t>();
      for (int64_t i = 0; i < y.numel(); ++i)
        if (lab[i] < 0 || lab[i] >= net_.outputs)
          throw std::out_of_range("softmax_cross_entropy: label " + std::to_string(lab[i]) +
                                  " at row " + std::to_string(i) + " outside [0, " +
                                  std::to_string(net_.outputs) + ")");
    }
    if (net_.vocab > 0) {
      const float* ids = x.f32();
      for (int64_t i = 0; i < x.numel(); ++i)
        if (!(ids[i] >= 0 && ids[i] < static_cast<float>(net_.vocab)) ||
            ids[i] != std::floor(ids[i]))
          throw std::out_of_range("embedding: id " + std::to_string(ids[i]) + " at row " +
                                  std::to_string(i / features_) + " is not an integer in [0, " +
                                  std::to_string(net_.vocab) + ")");
    }
  }

  void place_on_device() {
    int64_t total = 0;
    for (auto& v : net_.vars) {
      grad_offsets_.push_back(total);
      total += v.value.numel();
      dvars_.push_back(ctx_->allocate(v.value.nbytes()));
    }
    for (auto& b : buffers_) dbufs_.push_back(ctx_->allocate(b.value.nbytes()));
    dgrads_ = ctx_->allocate(static_cast<std::size_t>(std::max<int64_t>(total, 1)) * sizeof(float));
    ops().fill(dgrads_.f32(), 0.0f, static_cast<std::size_t>(total));
    dstats_ = ctx_->allocate(sizeof(double) + sizeof(int64_t));
    variables_to_device();
  }

  float* var(std::size_t i) { return resident_ ? dvars_[i].f32() : net_.vars[i].value.f32(); }
  float* buf(std::size_t i) { return resident_ ? dbufs_[i].f32() : buffers_[i].value.f32(); }
  float* dgrad(std::size_t i) {
    if (resident_) return dgrads_.f32() + grad_offsets_[i];
    if (!host_grads_) throw std::logic_error("model: no gradients before the first train_batch");
    return (*host_grads_)[i].value.f32();
  }

  // The batch where the device reads it: the caller's tensors on cpu:N;
  // else an upload (checked on the host first: a device cannot throw).
  const float* stage_batch(const tensor& x, const tensor& y) {
    if (!resident_) {
      check_inputs(x, y);
      return x.f32();
    }
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
    check_inputs(x, y);
    if (dx_.bytes() < x.nbytes()) dx_ = ctx_->allocate(x.nbytes());
    if (dy_.bytes() < y.nbytes()) dy_ = ctx_->allocate(y.nbytes());
    // Not prefetched: on the compute stream, behind the work before it (an
    // upload on the copy stream would wait for that work and block here).
    ctx_->copy_to_device(dx_.data(), x.raw(), x.nbytes());
    ctx_->copy_to_device(dy_.data(), y.raw(), y.nbytes());
    return dx_.f32();
  }
  // The labels of the batch staged last (stage_batch), where the device
  // reads them.
  const void* label_ptr(const tensor& y) const { return resident_ ? dy_.data() : y.raw(); }

  double* loss_ptr() { return resident_ ? dstats_.as<double>() : &host_loss_; }
  int64_t* correct_ptr() {
    return resident_ ? reinterpret_cast<int64_t*>(dstats_.as<unsigned char>() + sizeof(double))
                     : &host_correct_;
  }
  void stats_begin() { ops().fill_stats(loss_ptr(), correct_ptr()); }
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

  network net_;
  std::shared_ptr<device_context> ctx_;
  bool resident_;
  uint64_t seed_;
  int64_t features_;
  int64_t step_ = 0;
  tensor ids_, host_ids_;
  process_group* group_ = nullptr;
  device_buffer dout_;                               // the gradient of the last layer's output
  std::vector<named_tensor>* host_grads_ = nullptr;  // cpu:N: the caller's, in place
  double host_loss_ = 0;
  int64_t host_correct_ = 0;
  // Discrete devices only.
  std::vector<device_buffer> dvars_, dbufs_;
  device_buffer dgrads_;
  std::vector<int64_t> grad_offsets_;
  device_buffer dx_, dy_, dstats_, dids_;
  device_buffer dimages_, dlabels_;                    // attach_dataset's
  device_buffer planned_x_, planned_y_, planned_ids_;  // train_planned's rows
  int64_t label_words_ = 1;                            // 4-byte words of labels a row
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

std::unique_ptr<model> make_layer_model(const model_config& c, const model_shape& s,
                                        uint64_t seed) {
  return std::make_unique<layer_model>(c, s, seed, nullptr);
}

std::unique_ptr<model> make_layer_model_on(const model_config& c, const model_shape& s,
                                           uint64_t seed, std::shared_ptr<device_context> ctx) {
  return std::make_unique<layer_model>(c, s, seed, std::move(ctx));
}

namespace {
// Whether `specs` have a batch_norm layer (synced ones only, with
// synced_only), residual blocks included.
bool batch_norm_in(const nlohmann::json& specs, bool synced_only) {
  if (!specs.is_array()) return false;
  for (const auto& s : specs) {
    auto t = layers::type_of(&s);
    if (t == "batch_norm" && (!synced_only || s.value("sync", true))) return true;
    if (t == "residual" && s.contains("layers") && batch_norm_in(s["layers"], synced_only))
      return true;
  }
  return false;
}
}  // namespace

bool uses_synced_statistics(const model_config& c) {
  return batch_norm_in(c.layers, true);
}

bool has_model_buffers(const model_config& c) {
  return batch_norm_in(c.layers, false);
}

int64_t check_layer_model(const model_config& c, const model_shape& s) {
  return network(c, s, 0, true).parameters;
}

}  // namespace troupe
