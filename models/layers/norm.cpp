// batch_norm: per channel over the batch (and the pixels of an image),
// gamma/beta trained, running mean/variance kept as buffers (saved with the
// checkpoint) and used at evaluation. With "sync" (the default) the
// statistics are all-reduced over the replicas each step, so N replicas of
// B/N examples normalise exactly as one device with B; alone, or without
// a group, each replica uses its own batch.
// layer_norm: per example over all its values, gamma/beta per value.
#include <cstring>

#include "collectives/process_group.hpp"
#include "models/layers/keys.hpp"

namespace troupe::layers {
namespace {

class batch_norm final : public layer {
 public:
  batch_norm(const shape& in, float momentum, float eps, bool sync)
      : channels_(in[0]),
        spatial_(in.size() == 3 ? in[1] * in[2] : 1),
        momentum_(momentum),
        eps_(eps),
        sync_(sync) {
    out_ = in;
  }
  std::size_t first_buf = 0;  // running mean, running variance

  void forward(run_context& rc, const float* x, float* y) override {
    scratch(rc);
    const float* gamma = rc.vars[first_var];
    const float* beta = rc.vars[first_var + 1];
    float* mean = stats_.f32();
    float* invstd = mean + channels_;
    if (!rc.training) {
      rc.ops->invstd_from_variance(rc.bufs[first_buf + 1], eps_, invstd,
                                   static_cast<std::size_t>(channels_));
      rc.ops->batch_norm_forward(x, rc.bufs[first_buf], invstd, gamma, beta, y, rc.batch, channels_,
                                 spatial_);
      return;
    }
    float* sums = sums_.f32();
    rc.ops->batch_norm_sums(x, rc.batch, channels_, spatial_, sums);
    count_ = reduce(rc, sums, 2 * channels_);
    rc.ops->batch_norm_statistics(sums, channels_, count_, eps_, momentum_, mean, invstd,
                                  rc.bufs[first_buf], rc.bufs[first_buf + 1]);
    rc.ops->batch_norm_forward(x, mean, invstd, gamma, beta, y, rc.batch, channels_, spatial_);
  }

  void backward(run_context& rc, const float* x, const float*, float* dy, float* dx) override {
    const float* mean = stats_.f32();
    const float* invstd = mean + channels_;
    float* sums = sums_.f32();
    const auto c = static_cast<std::size_t>(channels_);
    rc.ops->batch_norm_backward_sums(x, dy, mean, invstd, rc.batch, channels_, spatial_, sums);
    // The local sums are this replica's gamma and beta gradients (the
    // strategy reduces those); dx needs them over the whole batch.
    float* dgamma = rc.grads[first_var];
    float* dbeta = rc.grads[first_var + 1];
    if (rc.accumulate) {
      rc.ops->add_inplace(dbeta, sums, c);
      rc.ops->add_inplace(dgamma, sums + c, c);
    } else {
      rc.ops->copy(dbeta, sums, c);
      rc.ops->copy(dgamma, sums + c, c);
    }
    if (!dx) return;
    reduce(rc, sums, 2 * channels_);
    rc.ops->batch_norm_backward(x, dy, mean, invstd, rc.vars[first_var], sums, count_, dx, rc.batch,
                                channels_, spatial_);
  }

  void idle_forward(run_context& rc) override {
    if (!sync_ || !rc.sync) return;
    scratch(rc);
    rc.ops->fill(sums_.f32(), 0.0f, 2 * static_cast<std::size_t>(channels_));
    count_ = reduce(rc, sums_.f32(), 2 * channels_);
    // The running statistics move as the other replicas' do.
    if (count_ > 0)
      rc.ops->batch_norm_statistics(sums_.f32(), channels_, count_, eps_, momentum_, stats_.f32(),
                                    stats_.f32() + channels_, rc.bufs[first_buf],
                                    rc.bufs[first_buf + 1]);
  }
  void idle_backward(run_context& rc) override {
    if (!sync_ || !rc.sync) return;
    rc.ops->fill(sums_.f32(), 0.0f, 2 * static_cast<std::size_t>(channels_));
    reduce(rc, sums_.f32(), 2 * channels_);
  }

 private:
  void scratch(run_context& rc) {
    if (!stats_) stats_ = rc.dev->allocate(2 * static_cast<std::size_t>(channels_) * sizeof(float));
    if (!sums_)
      sums_ = rc.dev->allocate((2 * static_cast<std::size_t>(channels_) + 1) * sizeof(float));
  }
  // Sums over the replicas when synced; returns the examples' positions they
  // cover (the group's, when synced).
  double reduce(run_context& rc, float* sums, int64_t n) {
    const double local = static_cast<double>(rc.batch * spatial_);
    if (!sync_ || !rc.sync || rc.sync->size() == 1) return local;
    // The count travels with the sums: replicas may hold unequal slices.
    rc.ops->fill(sums + n, static_cast<float>(local), 1);
    rc.sync->all_reduce(sums, static_cast<std::size_t>(n) + 1, reduce_op::sum);
    float total = 0;
    rc.dev->copy_to_host(&total, sums + n, sizeof total);
    return total;
  }

  int64_t channels_, spatial_;
  float momentum_, eps_;
  bool sync_;
  double count_ = 0;
  device_buffer stats_;  // mean, invstd of the last training forward
  device_buffer sums_;
};

class layer_norm final : public layer {
 public:
  layer_norm(const shape& in, float eps) : cols_(numel(in)), eps_(eps) { out_ = in; }
  void forward(run_context& rc, const float* x, float* y) override {
    const auto bytes = 2 * static_cast<std::size_t>(rc.batch) * sizeof(float);
    if (stats_.bytes() < bytes) stats_ = rc.dev->allocate(bytes);
    rc.ops->layer_norm_forward(x, rc.vars[first_var], rc.vars[first_var + 1], y, stats_.f32(),
                               stats_.f32() + rc.batch, rc.batch, cols_, eps_);
  }
  void backward(run_context& rc, const float* x, const float*, float* dy, float* dx) override {
    rc.ops->layer_norm_backward(x, dy, rc.vars[first_var], stats_.f32(), stats_.f32() + rc.batch,
                                dx, rc.grads[first_var], rc.grads[first_var + 1], rc.batch, cols_,
                                rc.accumulate);
  }

 private:
  int64_t cols_;
  float eps_;
  device_buffer stats_;
};

float read_eps(const object_reader& r) {
  float eps = 1e-5f;
  r.with("epsilon", [&](const json& v, const std::string& p) {
    eps = static_cast<float>(json_read::read_number(v, p, json_read::positive));
  });
  return eps;
}

// gamma (ones) and beta (zeros) of `n` values.
void add_scale_shift(layer& l, const std::string& path, const std::string& name, int64_t n,
                     build_context& bc) {
  bc.reserve(path, {2, n});
  l.first_var = bc.add_variable(name + "/gamma", bc.zeros({n}, 1.0f));
  bc.add_variable(name + "/beta", bc.zeros({n}));
  l.last_var = bc.vars->size();
}

}  // namespace

std::unique_ptr<layer> build_batch_norm(const json& spec, const std::string& path, const shape& in,
                                        const json*, build_context& bc) {
  object_reader r(spec, path, {"type", "momentum", "epsilon", "sync"});
  if (in.size() != 1 && in.size() != 3)
    needs_input(path, "batch_norm", "[C,H,W] or [features]", in);
  float momentum = 0.1f;
  r.with("momentum", [&](const json& v, const std::string& p) {
    momentum = static_cast<float>(json_read::read_number(v, p, json_read::unit_closed));
  });
  bool sync = true;
  r.with("sync", [&](const json& v, const std::string& p) { sync = json_read::read_bool(v, p); });
  auto l = std::make_unique<batch_norm>(in, momentum, read_eps(r), sync);
  auto name = bc.name_for("batch_norm");
  add_scale_shift(*l, path, name, in[0], bc);
  l->first_buf = bc.add_buffer(name + "/moving_mean", bc.zeros({in[0]}));
  bc.add_buffer(name + "/moving_variance", bc.zeros({in[0]}, 1.0f));
  bc.has_batch_norm = true;
  bc.sync_batch_norm = bc.sync_batch_norm || sync;
  return l;
}

std::unique_ptr<layer> build_layer_norm(const json& spec, const std::string& path, const shape& in,
                                        const json*, build_context& bc) {
  object_reader r(spec, path, {"type", "epsilon"});
  auto l = std::make_unique<layer_norm>(in, read_eps(r));
  add_scale_shift(*l, path, bc.name_for("layer_norm"), numel(in), bc);
  return l;
}

}  // namespace troupe::layers
