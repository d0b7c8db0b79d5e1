// dropout: in training, each value kept with probability 1 - rate and scaled
// by 1 / (1 - rate); at evaluation, the identity. The mask of a value is a
// function of (job seed, step, layer, example id, position) only
// (kernels/layer_ops.hpp: dropout_keep), so N replicas holding slices of a
// batch draw exactly the masks one device holding it all draws.
#include "models/layers/keys.hpp"
#include "models/random.hpp"

namespace troupe::layers {
namespace {

class dropout final : public layer {
 public:
  dropout(const shape& in, float rate, uint64_t stream) : rate_(rate), stream_(stream) {
    out_ = in;
  }
  void forward(run_context& rc, const float* x, float* y) override {
    if (!rc.training || rate_ == 0.0f) {
      rc.ops->copy(y, x, static_cast<std::size_t>(rc.batch * numel(out_)));
      return;
    }
    mask(rc, x, y);
  }
  void backward(run_context& rc, const float*, const float*, float* dy, float* dx) override {
    if (!dx) return;
    if (rate_ == 0.0f) {
      rc.ops->copy(dx, dy, static_cast<std::size_t>(rc.batch * numel(out_)));
      return;
    }
    mask(rc, dy, dx);
  }

 private:
  void mask(run_context& rc, const float* in, float* out) const {
    if (rc.step_counter)
      rc.ops->dropout_at_step(in, out, rc.batch, numel(out_), rate_, rc.base_seed, stream_,
                              rc.step_counter, rc.example_ids);
    else
      rc.ops->dropout(in, out, rc.batch, numel(out_), rate_, seed(rc), rc.example_ids);
  }
  uint64_t seed(const run_context& rc) const { return derive_seed(rc.step_seed, stream_); }
  float rate_;
  uint64_t stream_;
};

}  // namespace

std::unique_ptr<layer> build_dropout(const json& spec, const std::string& path, const shape& in,
                                     const json*, build_context& bc) {
  object_reader r(spec, path, {"type", "rate"});
  float rate = 0.5f;
  r.with("rate", [&](const json& v, const std::string& p) {
    rate = static_cast<float>(json_read::read_number(v, p, json_read::unit_open_hi));
  });
  return std::make_unique<dropout>(in, rate, static_cast<uint64_t>(bc.dropout_layers++));
}

}  // namespace troupe::layers
