// The layer operations of kernels/backend.hpp on cuda:0 (cuDNN convolutions,
// kernels/cuda_*_layers.cu) against the CPU backend, on the same random inputs
// and odd shapes (asymmetric padding, dilation, groups, sizes that are no
// multiple of a warp). Without a GPU it prints why and exits 77, which ctest
// counts as skipped (label gpu).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "devices/cuda_context.hpp"
#include "devices/device_context.hpp"
#include "kernels/backend.hpp"
#include "kernels/layer_ops.hpp"
#include "tests/cuda_fixtures.hpp"
#include "tests/device_fixtures.hpp"
#include "tests/fixtures.hpp"

using namespace troupe;
using troupe::kernels::conv2d_shape;
using troupe::kernels::pool2d_shape;
using troupe::kernels::pool_kind;
using troupe::kernels::unary_op;
using troupe::test::random_floats;

namespace {

using floats = std::vector<float>;

// Outputs that must be overwritten start as NaN on the GPU and as this on
// the CPU: an element either side leaves unwritten mismatches.
constexpr float cpu_garbage = -7.0f;

constexpr double ew_tol = 1e-5;   // element-wise
constexpr double sum_tol = 1e-4;  // sums of products, normalisation

using troupe::test::gpu_fixture;

std::size_t sz(int64_t a) {
  return static_cast<std::size_t>(a);
}

// ---- convolution -------------------------------------------------------------

struct conv_case {
  const char* name;
  conv2d_shape s;
};

conv2d_shape conv(int64_t in_c, int64_t out_c, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                  int64_t dh, int64_t dw, int64_t top, int64_t left, int64_t bottom, int64_t right,
                  int64_t groups) {
  conv2d_shape s;
  s.batch = 3;
  s.in_channels = in_c;
  s.in_h = 7;
  s.in_w = 9;
  s.out_channels = out_c;
  s.kernel_h = kh;
  s.kernel_w = kw;
  s.stride_h = sh;
  s.stride_w = sw;
  s.dilation_h = dh;
  s.dilation_w = dw;
  s.pad_top = top;
  s.pad_left = left;
  s.pad_bottom = bottom;
  s.pad_right = right;
  s.groups = groups;
  return s;
}

const conv_case conv_cases[] = {
    {"5->4, 3x2, stride 2, dilation 2, pads t1 l0 b2 r1",
     conv(5, 4, 3, 2, 2, 2, 2, 2, 1, 0, 2, 1, 1)},
    {"6->4, groups 2, 3x2, stride 2, dilation 2, pads t1 l0 b2 r1",
     conv(6, 4, 3, 2, 2, 2, 2, 2, 1, 0, 2, 1, 2)},
    {"5->3, 3x3, stride 1, symmetric pad 1", conv(5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1)},
    {"depthwise 4->8, groups 4, 2x3, stride 1x2, dilation 2x1, pads t0 l1 b1 r0",
     conv(4, 8, 2, 3, 1, 2, 2, 1, 0, 1, 1, 0, 4)},
    {"1x1, 5->7, no padding", conv(5, 7, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1)},
};

struct conv_sizes {
  std::size_t x, w, y, b;
};

conv_sizes sizes_of(const conv2d_shape& s) {
  return {sz(s.batch * s.in_channels * s.in_h * s.in_w),
          sz(s.out_channels * (s.in_channels / s.groups) * s.kernel_h * s.kernel_w),
          sz(s.batch * s.out_channels * s.out_h() * s.out_w()), sz(s.out_channels)};
}

TEST_CASE("cuda layers: conv2d forward matches the CPU") {
  gpu_fixture f;
  unsigned seed = 100;
  for (const auto& c : conv_cases) {
    INFO(c.name);
    const auto n = sizes_of(c.s);
    const floats x = random_floats(n.x, ++seed), w = random_floats(n.w, ++seed),
                 b = random_floats(n.b, ++seed);
    auto gx = f.upload(x), gw = f.upload(w), gb = f.upload(b);
    for (const bool with_bias : {true, false}) {
      INFO("bias " << with_bias);
      floats want(n.y, cpu_garbage);
      f.cpu.conv2d_forward(c.s, x.data(), w.data(), with_bias ? b.data() : nullptr, want.data());
      auto gy = f.output(n.y);
      f.gpu.conv2d_forward(c.s, gx.f32(), gw.f32(), with_bias ? gb.f32() : nullptr, gy.f32());
      CHECK_CLOSE(f.download(gy, n.y), want, sum_tol);
    }
  }
}

// training.tf32 "convolutions": cuDNN may take its TF32 tensor-core
// algorithms; the products then round their inputs to 10-bit mantissas, so
// the result is within ~1e-3 relative of the CPU's, not ~1e-6.
TEST_CASE("cuda layers: conv2d with TF32 allowed stays within TF32's rounding of the CPU") {
  gpu_fixture f;
  f.gpu.use_tf32({true, false});
  constexpr double tf32_tol = 1e-2;
  unsigned seed = 150;
  for (const auto& c : conv_cases) {
    INFO(c.name);
    const auto n = sizes_of(c.s);
    const floats x = random_floats(n.x, ++seed), w = random_floats(n.w, ++seed),
                 b = random_floats(n.b, ++seed), dy = random_floats(n.y, ++seed);
    auto gx = f.upload(x), gw = f.upload(w), gb = f.upload(b), gdy = f.upload(dy);
    floats y(n.y), dx(n.x), dw(n.w), db(n.b);
    f.cpu.conv2d_forward(c.s, x.data(), w.data(), b.data(), y.data());
    f.cpu.conv2d_backward(c.s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                          false);
    auto gy = f.output(n.y), gdx = f.output(n.x), gdw = f.output(n.w), gdb = f.output(n.b);
    f.gpu.conv2d_forward(c.s, gx.f32(), gw.f32(), gb.f32(), gy.f32());
    f.gpu.conv2d_backward(c.s, gx.f32(), gw.f32(), gdy.f32(), gdx.f32(), gdw.f32(), gdb.f32(),
                          false);
    CHECK_CLOSE(f.download(gy, n.y), y, tf32_tol);
    CHECK_CLOSE(f.download(gdx, n.x), dx, tf32_tol);
    CHECK_CLOSE(f.download(gdw, n.w), dw, tf32_tol);
    CHECK_CLOSE(f.download(gdb, n.b), db, tf32_tol);
  }
}

TEST_CASE("cuda layers: conv2d backward matches the CPU (dx, dw, db; overwrite and accumulate)") {
  gpu_fixture f;
  unsigned seed = 200;
  for (const auto& c : conv_cases) {
    INFO(c.name);
    const auto n = sizes_of(c.s);
    const floats x = random_floats(n.x, ++seed), w = random_floats(n.w, ++seed),
                 dy = random_floats(n.y, ++seed), dw0 = random_floats(n.w, ++seed),
                 db0 = random_floats(n.b, ++seed);
    auto gx = f.upload(x), gw = f.upload(w), gdy = f.upload(dy);
    for (const bool accumulate : {false, true}) {
      INFO("accumulate " << accumulate);
      floats dx(n.x, cpu_garbage), dw = accumulate ? dw0 : floats(n.w, cpu_garbage),
                                   db = accumulate ? db0 : floats(n.b, cpu_garbage);
      f.cpu.conv2d_backward(c.s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                            accumulate);
      auto gdx = f.output(n.x);
      auto gdw = accumulate ? f.upload(dw0) : f.output(n.w);
      auto gdb = accumulate ? f.upload(db0) : f.output(n.b);
      f.gpu.conv2d_backward(c.s, gx.f32(), gw.f32(), gdy.f32(), gdx.f32(), gdw.f32(), gdb.f32(),
                            accumulate);
      CHECK_CLOSE(f.download(gdx, n.x), dx, sum_tol);
      CHECK_CLOSE(f.download(gdw, n.w), dw, sum_tol);
      CHECK_CLOSE(f.download(gdb, n.b), db, sum_tol);
    }
    // The first layer: no dx, no bias.
    floats dw(n.w, cpu_garbage);
    f.cpu.conv2d_backward(c.s, x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr, false);
    auto gdw = f.output(n.w);
    f.gpu.conv2d_backward(c.s, gx.f32(), gw.f32(), gdy.f32(), nullptr, gdw.f32(), nullptr, false);
    CHECK_CLOSE(f.download(gdw, n.w), dw, sum_tol);
  }
}

// ---- pooling -------------------------------------------------------------------

pool2d_shape pool(pool_kind kind, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t top,
                  int64_t left, int64_t bottom, int64_t right) {
  pool2d_shape s;
  s.kind = kind;
  s.batch = 3;
  s.channels = 5;
  s.in_h = 7;
  s.in_w = 9;
  s.kernel_h = kh;
  s.kernel_w = kw;
  s.stride_h = sh;
  s.stride_w = sw;
  s.pad_top = top;
  s.pad_left = left;
  s.pad_bottom = bottom;
  s.pad_right = right;
  return s;
}

TEST_CASE("cuda layers: max and average pooling match the CPU (forward, backward, inference)") {
  gpu_fixture f;
  unsigned seed = 300;
  for (const pool_kind kind : {pool_kind::max, pool_kind::avg}) {
    const pool2d_shape shapes[] = {
        pool(kind, 3, 2, 2, 2, 1, 0, 0, 1),  // asymmetric padding
        pool(kind, 2, 2, 2, 2, 0, 0, 0, 0),  // the usual, odd image: last row/column dropped
        pool(kind, 3, 3, 1, 1, 1, 1, 1, 1),  // overlapping windows
        pool(kind, 2, 3, 2, 1, 1, 2, 1, 0),
        pool(kind, 7, 9, 7, 9, 0, 0, 0, 0),  // the whole 7x9 image: global_avg_pool2d's window
    };
    for (const auto& s : shapes) {
      INFO((kind == pool_kind::max ? "max" : "avg")
           << " kernel " << s.kernel_h << "x" << s.kernel_w << " stride " << s.stride_h << "x"
           << s.stride_w << " pads " << s.pad_top << s.pad_left << s.pad_bottom << s.pad_right);
      const std::size_t nx = sz(s.batch * s.channels * s.in_h * s.in_w),
                        ny = sz(s.batch * s.channels * s.out_h() * s.out_w());
      // Continuous random values: no ties for the max.
      const floats x = random_floats(nx, ++seed), dy = random_floats(ny, ++seed);
      auto gx = f.upload(x), gdy = f.upload(dy);

      const std::size_t cpu_ws_bytes = f.cpu.pool2d_workspace_bytes(s);
      std::vector<std::max_align_t> cpu_ws(cpu_ws_bytes / sizeof(std::max_align_t) + 1);
      auto gws = f.ctx->allocate(std::max<std::size_t>(f.gpu.pool2d_workspace_bytes(s), 1));

      floats y(ny, cpu_garbage);
      f.cpu.pool2d_forward(s, x.data(), y.data(), cpu_ws.data());
      auto gy = f.output(ny);
      f.gpu.pool2d_forward(s, gx.f32(), gy.f32(), gws.data());
      CHECK_CLOSE(f.download(gy, ny), y, ew_tol);

      floats dx(nx, cpu_garbage);
      f.cpu.pool2d_backward(s, x.data(), dy.data(), dx.data(), cpu_ws.data());
      auto gdx = f.output(nx);
      f.gpu.pool2d_backward(s, gx.f32(), gdy.f32(), gdx.f32(), gws.data());
      CHECK_CLOSE(f.download(gdx, nx), dx, ew_tol);

      auto gy2 = f.output(ny);
      f.gpu.pool2d_forward(s, gx.f32(), gy2.f32(), nullptr);
      CHECK_CLOSE(f.download(gy2, ny), y, ew_tol);
    }
  }
}

// ---- point-wise functions ------------------------------------------------------

TEST_CASE("cuda layers: unary functions match the CPU (forward and backward)") {
  gpu_fixture f;
  const std::size_t n = 1001;
  const float alpha = 0.1f;
  unsigned seed = 400;
  for (const unary_op op :
       {unary_op::relu, unary_op::leaky_relu, unary_op::gelu, unary_op::tanh, unary_op::sigmoid}) {
    INFO("unary_op " << static_cast<int>(op));
    const floats x = random_floats(n, ++seed, -4.0f, 4.0f), dy = random_floats(n, ++seed);
    floats y(n, cpu_garbage);
    f.cpu.unary_forward(op, alpha, x.data(), y.data(), n);
    auto gx = f.upload(x), gy = f.output(n);
    f.gpu.unary_forward(op, alpha, gx.f32(), gy.f32(), n);
    CHECK_CLOSE(f.download(gy, n), y, ew_tol);

    // The backward on the same x and y both sides (the CPU's y).
    floats dx(n, cpu_garbage);
    f.cpu.unary_backward(op, alpha, x.data(), y.data(), dy.data(), dx.data(), n);
    auto gyc = f.upload(y), gdy = f.upload(dy), gdx = f.output(n);
    f.gpu.unary_backward(op, alpha, gx.f32(), gyc.f32(), gdy.f32(), gdx.f32(), n);
    CHECK_CLOSE(f.download(gdx, n), dx, ew_tol);
    // dx over dy.
    f.gpu.unary_backward(op, alpha, gx.f32(), gyc.f32(), gdy.f32(), gdy.f32(), n);
    CHECK_CLOSE(f.download(gdy, n), dx, ew_tol);
  }
}

// ---- batch norm ------------------------------------------------------------------

struct bn_case {
  int64_t batch, channels, spatial;
};

TEST_CASE("cuda layers: the batch-norm steps match the CPU") {
  gpu_fixture f;
  unsigned seed = 500;
  // An image batch (7x9), a dense one (spatial 1), and two whose channels'
  // sums run as several blocks each (batch_norm_splits > 1): large planes
  // with few channels, and planes smaller than a block.
  for (const bn_case c :
       {bn_case{3, 5, 63}, bn_case{7, 5, 1}, bn_case{64, 3, 784}, bn_case{256, 2, 49}}) {
    INFO("batch " << c.batch << " channels " << c.channels << " spatial " << c.spatial);
    const std::size_t nx = sz(c.batch * c.channels * c.spatial), nc = sz(c.channels);
    const double count = static_cast<double>(c.batch * c.spatial);
    const float eps = 1e-5f, momentum = 0.1f;
    // Off-centre data, so that the variance is not just the mean square.
    const floats x = random_floats(nx, ++seed, -0.7f, 1.3f), dy = random_floats(nx, ++seed),
                 gamma = random_floats(nc, ++seed, 0.5f, 1.5f), beta = random_floats(nc, ++seed),
                 rm0 = random_floats(nc, ++seed), rv0 = random_floats(nc, ++seed, 0.5f, 2.0f);
    auto gx = f.upload(x), gdy = f.upload(dy), ggamma = f.upload(gamma), gbeta = f.upload(beta);

    floats sums(2 * nc, cpu_garbage);
    f.cpu.batch_norm_sums(x.data(), c.batch, c.channels, c.spatial, sums.data());
    auto gsums = f.output(2 * nc);
    f.gpu.batch_norm_sums(gx.f32(), c.batch, c.channels, c.spatial, gsums.f32());
    CHECK_CLOSE(f.download(gsums, 2 * nc), sums, sum_tol);

    // Statistics from the same (the CPU's) sums, with and without running ones.
    floats mean(nc, cpu_garbage), invstd(nc, cpu_garbage), rm = rm0, rv = rv0;
    f.cpu.batch_norm_statistics(sums.data(), c.channels, count, eps, momentum, mean.data(),
                                invstd.data(), rm.data(), rv.data());
    auto gs = f.upload(sums), gmean = f.output(nc), ginvstd = f.output(nc), grm = f.upload(rm0),
         grv = f.upload(rv0);
    f.gpu.batch_norm_statistics(gs.f32(), c.channels, count, eps, momentum, gmean.f32(),
                                ginvstd.f32(), grm.f32(), grv.f32());
    CHECK_CLOSE(f.download(gmean, nc), mean, sum_tol);
    CHECK_CLOSE(f.download(ginvstd, nc), invstd, sum_tol);
    CHECK_CLOSE(f.download(grm, nc), rm, sum_tol);
    CHECK_CLOSE(f.download(grv, nc), rv, sum_tol);
    auto gmean2 = f.output(nc), ginvstd2 = f.output(nc);
    f.gpu.batch_norm_statistics(gs.f32(), c.channels, count, eps, momentum, gmean2.f32(),
                                ginvstd2.f32(), nullptr, nullptr);
    CHECK_CLOSE(f.download(gmean2, nc), mean, sum_tol);
    CHECK_CLOSE(f.download(ginvstd2, nc), invstd, sum_tol);

    floats inv_from_var(nc, cpu_garbage);
    f.cpu.invstd_from_variance(rv0.data(), eps, inv_from_var.data(), nc);
    auto ginv_from_var = f.output(nc);
    auto grv0 = f.upload(rv0);
    f.gpu.invstd_from_variance(grv0.f32(), eps, ginv_from_var.f32(), nc);
    CHECK_CLOSE(f.download(ginv_from_var, nc), inv_from_var, ew_tol);

    // Forward and backward on the CPU's statistics.
    auto gm = f.upload(mean), gi = f.upload(invstd);
    floats y(nx, cpu_garbage);
    f.cpu.batch_norm_forward(x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(),
                             y.data(), c.batch, c.channels, c.spatial);
    auto gy = f.output(nx);
    f.gpu.batch_norm_forward(gx.f32(), gm.f32(), gi.f32(), ggamma.f32(), gbeta.f32(), gy.f32(),
                             c.batch, c.channels, c.spatial);
    CHECK_CLOSE(f.download(gy, nx), y, sum_tol);

    floats bsums(2 * nc, cpu_garbage);
    f.cpu.batch_norm_backward_sums(x.data(), dy.data(), mean.data(), invstd.data(), c.batch,
                                   c.channels, c.spatial, bsums.data());
    auto gbsums = f.output(2 * nc);
    f.gpu.batch_norm_backward_sums(gx.f32(), gdy.f32(), gm.f32(), gi.f32(), c.batch, c.channels,
                                   c.spatial, gbsums.f32());
    CHECK_CLOSE(f.download(gbsums, 2 * nc), bsums, sum_tol);

    floats dx(nx, cpu_garbage);
    f.cpu.batch_norm_backward(x.data(), dy.data(), mean.data(), invstd.data(), gamma.data(),
                              bsums.data(), count, dx.data(), c.batch, c.channels, c.spatial);
    auto gb = f.upload(bsums), gdx = f.output(nx);
    f.gpu.batch_norm_backward(gx.f32(), gdy.f32(), gm.f32(), gi.f32(), ggamma.f32(), gb.f32(),
                              count, gdx.f32(), c.batch, c.channels, c.spatial);
    CHECK_CLOSE(f.download(gdx, nx), dx, sum_tol);
  }
}

// ---- layer norm ------------------------------------------------------------------

TEST_CASE("cuda layers: layer norm matches the CPU (forward, backward, accumulate)") {
  gpu_fixture f;
  unsigned seed = 600;
  struct ln_case {
    int64_t rows, cols;
  };
  for (const ln_case c : {ln_case{7, 37}, ln_case{4, 300}, ln_case{3, 1}}) {
    INFO("rows " << c.rows << " cols " << c.cols);
    const std::size_t n = sz(c.rows * c.cols), nr = sz(c.rows), nc = sz(c.cols);
    const float eps = 1e-5f;
    const floats x = random_floats(n, ++seed, -0.5f, 1.5f), dy = random_floats(n, ++seed),
                 gamma = random_floats(nc, ++seed, 0.5f, 1.5f), beta = random_floats(nc, ++seed),
                 dgamma0 = random_floats(nc, ++seed), dbeta0 = random_floats(nc, ++seed);
    auto gx = f.upload(x), gdy = f.upload(dy), ggamma = f.upload(gamma), gbeta = f.upload(beta);

    floats y(n, cpu_garbage), mean(nr, cpu_garbage), invstd(nr, cpu_garbage);
    f.cpu.layer_norm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                             invstd.data(), c.rows, c.cols, eps);
    auto gy = f.output(n), gmean = f.output(nr), ginvstd = f.output(nr);
    f.gpu.layer_norm_forward(gx.f32(), ggamma.f32(), gbeta.f32(), gy.f32(), gmean.f32(),
                             ginvstd.f32(), c.rows, c.cols, eps);
    CHECK_CLOSE(f.download(gy, n), y, sum_tol);
    CHECK_CLOSE(f.download(gmean, nr), mean, sum_tol);
    CHECK_CLOSE(f.download(ginvstd, nr), invstd, sum_tol);

    auto gm = f.upload(mean), gi = f.upload(invstd);
    for (const bool accumulate : {false, true}) {
      INFO("accumulate " << accumulate);
      floats dx(n, cpu_garbage), dgamma = accumulate ? dgamma0 : floats(nc, cpu_garbage),
                                 dbeta = accumulate ? dbeta0 : floats(nc, cpu_garbage);
      f.cpu.layer_norm_backward(x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                                dx.data(), dgamma.data(), dbeta.data(), c.rows, c.cols, accumulate);
      auto gdx = f.output(n);
      auto gdgamma = accumulate ? f.upload(dgamma0) : f.output(nc);
      auto gdbeta = accumulate ? f.upload(dbeta0) : f.output(nc);
      f.gpu.layer_norm_backward(gx.f32(), gdy.f32(), ggamma.f32(), gm.f32(), gi.f32(), gdx.f32(),
                                gdgamma.f32(), gdbeta.f32(), c.rows, c.cols, accumulate);
      CHECK_CLOSE(f.download(gdx, n), dx, sum_tol);
      CHECK_CLOSE(f.download(gdgamma, nc), dgamma, sum_tol);
      CHECK_CLOSE(f.download(gdbeta, nc), dbeta, sum_tol);
    }
  }
}

// ---- dropout -----------------------------------------------------------------------

TEST_CASE("cuda layers: dropout draws the CPU's mask") {
  gpu_fixture f;
  const std::vector<int64_t> ids = {10, 3, 7, 1000000007, 0};
  const int64_t rows = 5;
  for (const int64_t cols : {int64_t{37}, int64_t{1}}) {
    for (const float rate : {0.3f, 0.0f, 0.9f}) {
      INFO("cols " << cols << " rate " << rate);
      const std::size_t n = sz(rows * cols);
      const floats x = random_floats(n, 700 + static_cast<unsigned>(cols));
      const uint64_t seed = 0x5eed1234abcdULL;
      floats y(n, cpu_garbage);
      f.cpu.dropout(x.data(), y.data(), rows, cols, rate, seed, ids.data());
      auto gx = f.upload(x), gids = f.upload(ids), gy = f.output(n);
      f.gpu.dropout(gx.f32(), gy.f32(), rows, cols, rate, seed, gids.as<int64_t>());
      CHECK_CLOSE(f.download(gy, n), y, ew_tol);
      if (rate == 0.0f) CHECK_CLOSE(f.download(gy, n), x, 0.0);
    }
  }
}

// ---- embedding -----------------------------------------------------------------------

TEST_CASE("cuda layers: embedding lookup and scatter match the CPU") {
  gpu_fixture f;
  const int64_t vocab = 11, dim = 6, rows = 3, len = 4;
  std::mt19937 rng(800);
  std::uniform_int_distribution<int> pick(0, static_cast<int>(vocab) - 1);
  floats ids(sz(rows * len));
  for (auto& id : ids) id = static_cast<float>(pick(rng));
  ids[1] = ids[0];  // a repeated id: two additions to one row of dtable
  ids[5] = ids[0];
  const floats table = random_floats(sz(vocab * dim), 801),
               dtable0 = random_floats(sz(vocab * dim), 802);
  auto gids = f.upload(ids), gtable = f.upload(table);
  for (const bool bag : {false, true}) {
    INFO("bag_mean " << bag);
    const std::size_t nout = bag ? sz(rows * dim) : sz(rows * len * dim);
    floats out(nout, cpu_garbage);
    f.cpu.embedding_forward(ids.data(), table.data(), out.data(), rows, len, dim, bag);
    auto gout = f.output(nout);
    f.gpu.embedding_forward(gids.f32(), gtable.f32(), gout.f32(), rows, len, dim, bag);
    CHECK_CLOSE(f.download(gout, nout), out, ew_tol);

    const floats dy = random_floats(nout, 803);
    auto gdy = f.upload(dy);
    for (const bool accumulate : {false, true}) {
      INFO("accumulate " << accumulate);
      floats dtable = accumulate ? dtable0 : floats(sz(vocab * dim), cpu_garbage);
      f.cpu.embedding_backward(ids.data(), dy.data(), dtable.data(), rows, len, vocab, dim, bag,
                               accumulate);
      auto gdtable = accumulate ? f.upload(dtable0) : f.output(sz(vocab * dim));
      f.gpu.embedding_backward(gids.f32(), gdy.f32(), gdtable.f32(), rows, len, vocab, dim, bag,
                               accumulate);
      CHECK_CLOSE(f.download(gdtable, sz(vocab * dim)), dtable, ew_tol);
    }
  }
}

// ---- losses ------------------------------------------------------------------------------

struct loss_result {
  double loss = 0.0;
  int64_t correct = 0;
};

TEST_CASE("cuda layers: sigmoid cross-entropy matches the CPU (loss, count, gradient)") {
  gpu_fixture f;
  const int64_t batch = 7, outputs = 5;
  const std::size_t n = sz(batch * outputs);
  const floats logits = random_floats(n, 900, -4.0f, 4.0f);
  floats targets = random_floats(n, 901, 0.0f, 1.0f);
  // Rows 0-2 on the logits' side of 0.5 everywhere (counted correct), row 3
  // hard 0/1 targets.
  for (std::size_t i = 0; i < 3 * sz(outputs); ++i) targets[i] = logits[i] > 0.0f ? 0.9f : 0.1f;
  for (std::size_t i = 3 * sz(outputs); i < 4 * sz(outputs); ++i)
    targets[i] = (i % 2) ? 1.0f : 0.0f;
  const float grad_scale = 1.0f / static_cast<float>(batch);
  auto gl = f.upload(logits), gt = f.upload(targets);
  auto gloss = f.ctx->allocate(sizeof(double)), gcorrect = f.ctx->allocate(sizeof(int64_t));

  loss_result want;
  floats dlogits(n, cpu_garbage);
  f.cpu.sigmoid_cross_entropy(logits.data(), targets.data(), batch, outputs, grad_scale,
                              dlogits.data(), &want.loss, &want.correct);
  f.gpu.fill_stats(gloss.as<double>(), gcorrect.as<int64_t>());
  auto gd = f.output(n);
  f.gpu.sigmoid_cross_entropy(gl.f32(), gt.f32(), batch, outputs, grad_scale, gd.f32(),
                              gloss.as<double>(), gcorrect.as<int64_t>());
  CHECK_CLOSE(f.download(gd, n), dlogits, ew_tol);
  const double loss = f.download<double>(gloss, 1)[0];
  const int64_t correct = f.download<int64_t>(gcorrect, 1)[0];
  CHECK(loss == doctest::Approx(want.loss).epsilon(1e-6));
  CHECK(correct == want.correct);
  CHECK(correct >= 3);

  // Without a gradient, ADDING to what is there.
  f.gpu.sigmoid_cross_entropy(gl.f32(), gt.f32(), batch, outputs, grad_scale, nullptr,
                              gloss.as<double>(), gcorrect.as<int64_t>());
  CHECK(f.download<double>(gloss, 1)[0] == doctest::Approx(2.0 * want.loss).epsilon(1e-6));
  CHECK(f.download<int64_t>(gcorrect, 1)[0] == 2 * want.correct);
}

TEST_CASE("cuda layers: mean squared error matches the CPU (loss, gradient)") {
  gpu_fixture f;
  for (const int64_t outputs : {int64_t{5}, int64_t{1}, int64_t{70}}) {
    INFO("outputs " << outputs);
    const int64_t batch = 7;
    const std::size_t n = sz(batch * outputs);
    const floats pred = random_floats(n, 1000), targets = random_floats(n, 1001);
    const float grad_scale = 0.25f;
    auto gp = f.upload(pred), gt = f.upload(targets);
    auto gloss = f.ctx->allocate(sizeof(double)), gcorrect = f.ctx->allocate(sizeof(int64_t));

    double want = 0.0;
    floats dpred(n, cpu_garbage);
    f.cpu.mean_squared_error(pred.data(), targets.data(), batch, outputs, grad_scale, dpred.data(),
                             &want);
    f.gpu.fill_stats(gloss.as<double>(), gcorrect.as<int64_t>());
    auto gd = f.output(n);
    f.gpu.mean_squared_error(gp.f32(), gt.f32(), batch, outputs, grad_scale, gd.f32(),
                             gloss.as<double>());
    CHECK_CLOSE(f.download(gd, n), dpred, ew_tol);
    CHECK(f.download<double>(gloss, 1)[0] == doctest::Approx(want).epsilon(1e-6));

    f.gpu.mean_squared_error(gp.f32(), gt.f32(), batch, outputs, grad_scale, nullptr,
                             gloss.as<double>());
    CHECK(f.download<double>(gloss, 1)[0] == doctest::Approx(2.0 * want).epsilon(1e-6));
  }
}

}  // namespace

int main(int argc, char** argv) {
  return troupe::test::gpu_test_main(argc, argv);
}
