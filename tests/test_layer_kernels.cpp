// The CPU layer operations (kernels/cpu_layers.hpp) against naive double
// references written here, and their backwards against central differences
// of a scalar loss sum(r * y) taken on those references, on odd shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu_isa.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/cpu_layers.hpp"
#include "kernels/layer_ops.hpp"
#include "tests/fixtures.hpp"

using namespace troupe::kernels;
using troupe::test::random_floats;
using dvec = std::vector<double>;
using fvec = std::vector<float>;

namespace {

dvec to_double(const fvec& v) {
  return dvec(v.begin(), v.end());
}

double dot(const dvec& a, const dvec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss(p) with respect to every element of p.
template <class F>
dvec numeric_gradient(dvec p, F loss, double h = 1e-4) {
  dvec g(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double v = p[i];
    p[i] = v + h;
    const double lp = loss(p);
    p[i] = v - h;
    const double lm = loss(p);
    p[i] = v;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// Every element within tol * (1 + |want|); reports the first misses.
void check_near(const fvec& got, const dvec& want, double tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= tol * (1 + std::fabs(want[i])))) {
      if (bad == 0) first = i;
      ++bad;
    }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size() << " differ; first at "
                               << first << ": " << (bad ? got[first] : 0.0f) << " vs "
                               << (bad ? want[first] : 0.0));
}

// ---- convolution -----------------------------------------------------------

dvec conv_ref(const conv2d_shape& s, const dvec& x, const dvec& w, const dvec* b) {
  const int64_t oh_n = s.out_h(), ow_n = s.out_w();
  const int64_t cin_g = s.in_channels / s.groups, cout_g = s.out_channels / s.groups;
  dvec y(static_cast<std::size_t>(s.batch * s.out_channels * oh_n * ow_n));
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t co = 0; co < s.out_channels; ++co) {
      const int64_t g = co / cout_g;
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          double acc = b ? (*b)[co] : 0.0;
          for (int64_t ci = 0; ci < cin_g; ++ci)
            for (int64_t kh = 0; kh < s.kernel_h; ++kh)
              for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
                const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
                const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
                if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
                acc += w[((co * cin_g + ci) * s.kernel_h + kh) * s.kernel_w + kw] *
                       x[((n * s.in_channels + g * cin_g + ci) * s.in_h + ih) * s.in_w + iw];
              }
          y[((n * s.out_channels + co) * oh_n + oh) * ow_n + ow] = acc;
        }
    }
  return y;
}

// The adjoint of conv_ref, for shapes too large for central differences
// (checked against them on the small ones).
void conv_ref_backward(const conv2d_shape& s, const dvec& x, const dvec& w, const dvec& dy,
                       dvec& dx, dvec& dw) {
  const int64_t oh_n = s.out_h(), ow_n = s.out_w();
  const int64_t cin_g = s.in_channels / s.groups, cout_g = s.out_channels / s.groups;
  dx.assign(x.size(), 0.0);
  dw.assign(w.size(), 0.0);
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t co = 0; co < s.out_channels; ++co)
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const double d = dy[((n * s.out_channels + co) * oh_n + oh) * ow_n + ow];
          for (int64_t ci = 0; ci < cin_g; ++ci)
            for (int64_t kh = 0; kh < s.kernel_h; ++kh)
              for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
                const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
                const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
                if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
                const int64_t wi = ((co * cin_g + ci) * s.kernel_h + kh) * s.kernel_w + kw;
                const int64_t xi =
                    ((n * s.in_channels + co / cout_g * cin_g + ci) * s.in_h + ih) * s.in_w + iw;
                dx[xi] += w[wi] * d;
                dw[wi] += x[xi] * d;
              }
        }
}

std::size_t conv_x_size(const conv2d_shape& s) {
  return static_cast<std::size_t>(s.batch * s.in_channels * s.in_h * s.in_w);
}
std::size_t conv_w_size(const conv2d_shape& s) {
  return static_cast<std::size_t>(s.out_channels * (s.in_channels / s.groups) * s.kernel_h *
                                  s.kernel_w);
}
std::size_t conv_y_size(const conv2d_shape& s) {
  return static_cast<std::size_t>(s.batch * s.out_channels * s.out_h() * s.out_w());
}

void check_conv(const conv2d_shape& s, unsigned seed) {
  const auto x = random_floats(conv_x_size(s), seed);
  const auto w = random_floats(conv_w_size(s), seed + 1);
  const auto b = random_floats(static_cast<std::size_t>(s.out_channels), seed + 2);
  const auto r = random_floats(conv_y_size(s), seed + 3);
  const dvec xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);

  fvec y(conv_y_size(s), 7.0f);
  cpu::conv2d_forward(s, x.data(), w.data(), b.data(), y.data());
  check_near(y, conv_ref(s, xd, wd, &bd), 1e-5, "conv2d_forward with bias");
  cpu::conv2d_forward(s, x.data(), w.data(), nullptr, y.data());
  check_near(y, conv_ref(s, xd, wd, nullptr), 1e-5, "conv2d_forward without bias");

  // dy = r is the gradient of L = sum(r * y).
  fvec dx(x.size(), 9.0f), dw(w.size(), 9.0f), db(b.size(), 9.0f);
  cpu::conv2d_backward(s, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), false);
  const auto gx =
      numeric_gradient(xd, [&](const dvec& p) { return dot(rd, conv_ref(s, p, wd, &bd)); });
  const auto gw =
      numeric_gradient(wd, [&](const dvec& p) { return dot(rd, conv_ref(s, xd, p, &bd)); });
  const auto gb =
      numeric_gradient(bd, [&](const dvec& p) { return dot(rd, conv_ref(s, xd, wd, &p)); });
  check_near(dx, gx, 1e-5, "conv2d dx");
  dvec adj_x, adj_w;
  conv_ref_backward(s, xd, wd, rd, adj_x, adj_w);
  check_near(fvec(adj_x.begin(), adj_x.end()), gx, 1e-6, "the reference adjoint's dx");
  check_near(fvec(adj_w.begin(), adj_w.end()), gw, 1e-6, "the reference adjoint's dw");
  check_near(dw, gw, 1e-5, "conv2d dw");
  check_near(db, gb, 1e-5, "conv2d db");

  // accumulate adds to dw and db; dx is overwritten; null dx and db skip.
  fvec dw2(w.size()), db2(b.size());
  for (std::size_t i = 0; i < dw2.size(); ++i) dw2[i] = 0.25f * float(i % 5);
  for (std::size_t i = 0; i < db2.size(); ++i) db2[i] = -0.5f * float(i % 3);
  dvec want_w(gw), want_b(gb);
  for (std::size_t i = 0; i < dw2.size(); ++i) want_w[i] += dw2[i];
  for (std::size_t i = 0; i < db2.size(); ++i) want_b[i] += db2[i];
  fvec dx2(x.size(), 123.0f);
  cpu::conv2d_backward(s, x.data(), w.data(), r.data(), dx2.data(), dw2.data(), db2.data(), true);
  check_near(dw2, want_w, 1e-5, "conv2d dw accumulated");
  check_near(db2, want_b, 1e-5, "conv2d db accumulated");
  check_near(dx2, gx, 1e-5, "conv2d dx with accumulate");
  fvec dw3(w.size(), 1e6f);
  cpu::conv2d_backward(s, x.data(), w.data(), r.data(), nullptr, dw3.data(), nullptr, false);
  check_near(dw3, gw, 1e-5, "conv2d dw without dx and db");
}

// ---- pooling ---------------------------------------------------------------

struct pool_ref_out {
  dvec y;
  std::vector<int64_t> src;  // max: the input index each output takes
};

pool_ref_out pool_ref(const pool2d_shape& s, const dvec& x) {
  const int64_t oh_n = s.out_h(), ow_n = s.out_w();
  pool_ref_out out;
  out.y.resize(static_cast<std::size_t>(s.batch * s.channels * oh_n * ow_n));
  out.src.resize(out.y.size(), -1);
  for (int64_t nc = 0; nc < s.batch * s.channels; ++nc)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        double best = -1e300, sum = 0;
        int64_t arg = -1, count = 0;
        for (int64_t kh = 0; kh < s.kernel_h; ++kh)
          for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
            const int64_t ih = oh * s.stride_h - s.pad_top + kh;
            const int64_t iw = ow * s.stride_w - s.pad_left + kw;
            if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
            const int64_t i = (nc * s.in_h + ih) * s.in_w + iw;
            if (x[i] > best) {  // strictly: the first largest keeps it
              best = x[i];
              arg = i;
            }
            sum += x[i];
            ++count;
          }
        const std::size_t o = static_cast<std::size_t>((nc * oh_n + oh) * ow_n + ow);
        out.y[o] = s.kind == pool_kind::max ? best : sum / double(count);
        out.src[o] = arg;
      }
  return out;
}

std::size_t pool_x_size(const pool2d_shape& s) {
  return static_cast<std::size_t>(s.batch * s.channels * s.in_h * s.in_w);
}
std::size_t pool_y_size(const pool2d_shape& s) {
  return static_cast<std::size_t>(s.batch * s.channels * s.out_h() * s.out_w());
}

// Forward against the reference; backward against central differences (on
// inputs without ties) and, for max, with ties the gradient goes to the
// first largest in the window; the backward without a workspace agrees.
void check_pool(const pool2d_shape& s, unsigned seed) {
  const auto r = random_floats(pool_y_size(s), seed + 1);
  const dvec rd = to_double(r);
  for (int ties = 0; ties < (s.kind == pool_kind::max ? 2 : 1); ++ties) {
    auto x = random_floats(pool_x_size(s), seed, -3.0f, 3.0f);
    if (ties)
      for (auto& v : x) v = std::floor(v);  // four values: many windows tie
    const dvec xd = to_double(x);
    std::vector<unsigned char> ws(cpu::pool2d_workspace_bytes(s) + 1, 0xcd);
    if (s.kind == pool_kind::avg) CHECK(cpu::pool2d_workspace_bytes(s) == 0);
    void* wsp = s.kind == pool_kind::max ? ws.data() : nullptr;
    fvec y(pool_y_size(s), 7.0f), y_infer(pool_y_size(s), 8.0f);
    cpu::pool2d_forward(s, x.data(), y.data(), wsp);
    cpu::pool2d_forward(s, x.data(), y_infer.data(), nullptr);
    const auto ref = pool_ref(s, xd);
    check_near(y, ref.y, 1e-6, "pool2d_forward");
    check_near(y_infer, ref.y, 1e-6, "pool2d_forward without workspace");

    fvec dx(x.size(), 5.0f), dx_nows(x.size(), 6.0f);
    cpu::pool2d_backward(s, x.data(), r.data(), dx.data(), wsp);
    cpu::pool2d_backward(s, x.data(), r.data(), dx_nows.data(), nullptr);
    dvec want(x.size(), 0.0);
    if (ties) {
      for (std::size_t o = 0; o < ref.src.size(); ++o) want[ref.src[o]] += rd[o];
    } else {
      want = numeric_gradient(
          xd, [&](const dvec& p) { return dot(rd, pool_ref(s, p).y); }, 1e-6);
    }
    check_near(dx, want, 1e-5, ties ? "max pool dx with ties" : "pool2d dx");
    check_near(dx_nows, want, 1e-5, "pool2d dx recomputing the winners");
  }
}

// ---- batch and layer norm --------------------------------------------------

dvec bn_ref(const dvec& x, const dvec& gamma, const dvec& beta, int64_t batch, int64_t ch,
            int64_t sp, double eps) {
  dvec y(x.size());
  const double count = double(batch * sp);
  for (int64_t c = 0; c < ch; ++c) {
    double m = 0, v = 0;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < sp; ++i) m += x[(n * ch + c) * sp + i];
    m /= count;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < sp; ++i) v += std::pow(x[(n * ch + c) * sp + i] - m, 2);
    v /= count;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < sp; ++i) {
        const auto j = (n * ch + c) * sp + i;
        y[j] = (x[j] - m) / std::sqrt(v + eps) * gamma[c] + beta[c];
      }
  }
  return y;
}

dvec ln_ref(const dvec& x, const dvec& gamma, const dvec& beta, int64_t rows, int64_t cols,
            double eps) {
  dvec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < cols; ++j) m += x[r * cols + j];
    m /= double(cols);
    for (int64_t j = 0; j < cols; ++j) v += std::pow(x[r * cols + j] - m, 2);
    v /= double(cols);
    for (int64_t j = 0; j < cols; ++j)
      y[r * cols + j] = (x[r * cols + j] - m) / std::sqrt(v + eps) * gamma[j] + beta[j];
  }
  return y;
}

double unary_ref(unary_op op, double alpha, double x) {
  switch (op) {
    case unary_op::relu:
      return x > 0 ? x : 0;
    case unary_op::leaky_relu:
      return x > 0 ? x : alpha * x;
    case unary_op::gelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case unary_op::tanh:
      return std::tanh(x);
    case unary_op::sigmoid:
      return 1 / (1 + std::exp(-x));
  }
  return 0;
}

}  // namespace

TEST_CASE("conv2d: forward and backward on odd shapes, groups 1 and > 1") {
  init_cpu_kernels();
  SUBCASE("groups 1: kernel 3x2, stride 2x1, dilation 2x1, asymmetric padding") {
    conv2d_shape s;
    s.batch = 3, s.in_channels = 5, s.in_h = 7, s.in_w = 9, s.out_channels = 4;
    s.kernel_h = 3, s.kernel_w = 2, s.stride_h = 2, s.stride_w = 1, s.dilation_h = 2;
    s.pad_top = 1, s.pad_left = 0, s.pad_bottom = 2, s.pad_right = 1;
    REQUIRE(s.out_h() == 3);
    REQUIRE(s.out_w() == 9);
    check_conv(s, 10);
  }
  SUBCASE("groups 2: kernel 3x3, stride 1x2, dilation 1x2") {
    conv2d_shape s;
    s.batch = 3, s.in_channels = 6, s.in_h = 7, s.in_w = 9, s.out_channels = 4, s.groups = 2;
    s.kernel_h = 3, s.kernel_w = 3, s.stride_w = 2, s.dilation_w = 2;
    s.pad_top = 0, s.pad_left = 2, s.pad_bottom = 1, s.pad_right = 0;
    check_conv(s, 20);
  }
  SUBCASE("depthwise: groups 5, two outputs per channel") {
    conv2d_shape s;
    s.batch = 2, s.in_channels = 5, s.in_h = 7, s.in_w = 9, s.out_channels = 10, s.groups = 5;
    s.kernel_h = 2, s.kernel_w = 3, s.stride_h = 2, s.stride_w = 2;
    s.pad_top = 1, s.pad_right = 2;
    check_conv(s, 30);
  }
  SUBCASE("the convnet's second layer, batch 32 (oneDNN's Winograd at AVX-512): 32 -> 64") {
    conv2d_shape s;
    s.batch = 32, s.in_channels = 32, s.in_h = 14, s.in_w = 14, s.out_channels = 64;
    s.kernel_h = 3, s.kernel_w = 3, s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
    // Sums of 288 (y), 576 (dx) and 6272 (dw) float products, and Winograd's
    // transforms: 2e-4 of the value's size (a misplaced term is off by ~1).
    const double tol = 2e-4;
    const auto x = random_floats(conv_x_size(s), 40);
    const auto w = random_floats(conv_w_size(s), 41);
    const auto b = random_floats(64, 42);
    const auto r = random_floats(conv_y_size(s), 43);
    fvec y(conv_y_size(s));
    cpu::conv2d_forward(s, x.data(), w.data(), b.data(), y.data());
    const dvec xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);
    check_near(y, conv_ref(s, xd, wd, &bd), tol, "conv 32->64 forward");
    fvec dx(x.size()), dw(w.size()), db(64);
    cpu::conv2d_backward(s, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), false);
    dvec gx, gw;
    conv_ref_backward(s, xd, wd, rd, gx, gw);
    check_near(dx, gx, tol, "conv 32->64 dx");
    check_near(dw, gw, tol, "conv 32->64 dw");
    double sum_r = 0;  // db[5]: dy summed over every example's channel-5 plane
    for (int64_t n = 0; n < 32; ++n)
      for (int64_t i = 0; i < 196; ++i)
        sum_r += rd[static_cast<std::size_t>((n * 64 + 5) * 196 + i)];
    CHECK(db[5] == doctest::Approx(sum_r).epsilon(1e-5));
  }
}

TEST_CASE("conv2d and pool2d: random small shapes against the references") {
  std::mt19937 rng(2026);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int convs = 0, pools = 0;
  for (int trial = 0; trial < 400 && (convs < 16 || pools < 16); ++trial) {
    conv2d_shape s;
    s.groups = pick(1, 3);
    s.batch = pick(1, 3), s.in_channels = s.groups * pick(1, 4);
    s.out_channels = s.groups * pick(1, 4);
    s.in_h = pick(1, 9), s.in_w = pick(1, 9);
    s.kernel_h = pick(1, 4), s.kernel_w = pick(1, 4);
    s.stride_h = pick(1, 3), s.stride_w = pick(1, 3);
    s.dilation_h = pick(1, 3), s.dilation_w = pick(1, 3);
    s.pad_top = pick(0, 2), s.pad_left = pick(0, 2), s.pad_bottom = pick(0, 2);
    s.pad_right = pick(0, 2);
    if (convs < 16 && s.out_h() > 0 && s.out_w() > 0) {
      CAPTURE(trial);
      check_conv(s, 1000 + unsigned(trial));
      ++convs;
    }
    pool2d_shape p;
    p.kind = pick(0, 1) ? pool_kind::max : pool_kind::avg;
    p.batch = pick(1, 3), p.channels = pick(1, 5), p.in_h = pick(1, 9), p.in_w = pick(1, 9);
    p.kernel_h = pick(1, 4), p.kernel_w = pick(1, 4), p.stride_h = pick(1, 3);
    p.stride_w = pick(1, 3);
    p.pad_top = pick(0, p.kernel_h - 1), p.pad_bottom = pick(0, p.kernel_h - 1);
    p.pad_left = pick(0, p.kernel_w - 1), p.pad_right = pick(0, p.kernel_w - 1);
    if (pools < 16 && p.out_h() > 0 && p.out_w() > 0) {
      CAPTURE(trial);
      check_pool(p, 2000 + unsigned(trial));
      ++pools;
    }
  }
  CHECK(convs == 16);
  CHECK(pools == 16);
}

// At the avx512 level, rows of even width run our own loops (16 windows at
// a time, the last ones masked); other widths and levels run oneDNN. ctest
// runs this file again with TROUPE_CPU_ISA=avx2 and baseline.
TEST_CASE("max pool 2x2 at stride 2: odd and even sizes, ties, partial vectors") {
  unsigned seed = 3000;
  for (int64_t h : {2, 3, 7, 28})
    for (int64_t w : {2, 5, 14, 28, 34, 66}) {
      pool2d_shape p;
      p.kind = pool_kind::max;
      p.batch = 2, p.channels = h == 28 ? 16 : 3, p.in_h = h, p.in_w = w;
      p.kernel_h = p.kernel_w = p.stride_h = p.stride_w = 2;
      CAPTURE(h);
      CAPTURE(w);
      if (w % 2 == 0 && troupe::kernels::active_isa() == troupe::kernels::cpu_isa::avx512)
        CHECK(cpu::pool2d_workspace_bytes(p) ==
              std::size_t(p.batch * p.channels * (h / 2) * (w / 2)));
      check_pool(p, seed++);
    }
}

TEST_CASE("conv2d: a repeated shape creates nothing; a shape that does not fit throws") {
  conv2d_shape s;
  s.batch = 2, s.in_channels = 3, s.in_h = 6, s.in_w = 5, s.out_channels = 4;
  s.kernel_h = 3, s.kernel_w = 3;
  const auto x = random_floats(conv_x_size(s), 1);
  const auto w = random_floats(conv_w_size(s), 2);
  fvec y(conv_y_size(s)), dx(x.size()), dw(w.size());
  cpu::conv2d_forward(s, x.data(), w.data(), nullptr, y.data());
  cpu::conv2d_backward(s, x.data(), w.data(), y.data(), dx.data(), dw.data(), nullptr, false);
  const auto before = cpu::cached_layer_shapes();
  for (int i = 0; i < 3; ++i) {
    cpu::conv2d_forward(s, x.data(), w.data(), nullptr, y.data());
    cpu::conv2d_backward(s, x.data(), w.data(), y.data(), dx.data(), dw.data(), nullptr, false);
  }
  CHECK(cpu::cached_layer_shapes() == before);

  // An empty batch (a replica's share of a short last batch): no output, a
  // zero gradient.
  conv2d_shape empty = s;
  empty.batch = 0;
  fvec dw0(w.size(), 5.0f), db0(4, 5.0f);
  cpu::conv2d_forward(empty, x.data(), w.data(), nullptr, y.data());
  cpu::conv2d_backward(empty, x.data(), w.data(), y.data(), nullptr, dw0.data(), db0.data(), false);
  CHECK(dw0 == fvec(w.size(), 0.0f));
  CHECK(db0 == fvec(4, 0.0f));

  conv2d_shape bad = s;
  bad.kernel_h = 8;  // taller than the 6 rows
  CHECK_THROWS_WITH_AS(cpu::conv2d_forward(bad, x.data(), w.data(), nullptr, y.data()),
                       doctest::Contains("conv2d"), std::invalid_argument);
  bad = s;
  bad.groups = 2;  // 3 input channels
  CHECK_THROWS_AS(cpu::conv2d_forward(bad, x.data(), w.data(), nullptr, y.data()),
                  std::invalid_argument);
}

TEST_CASE(
    "conv2d: channels that do not fill oneDNN's blocks, after another shape left NaN in "
    "the thread's scratch") {
  conv2d_shape s;  // 20 channels: padded to 32 in 16-channel blocks
  s.batch = 2, s.in_channels = 20, s.in_h = 6, s.in_w = 7, s.out_channels = 20;
  s.kernel_h = s.kernel_w = 3, s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
  conv2d_shape other;
  other.batch = 4, other.in_channels = 32, other.in_h = other.in_w = 8, other.out_channels = 48;
  other.kernel_h = other.kernel_w = 3;
  const fvec nan_x(conv_x_size(other), std::nanf("")), nan_w(conv_w_size(other), std::nanf(""));
  fvec ny(conv_y_size(other)), ndx(nan_x.size()), ndw(nan_w.size());
  const auto x = random_floats(conv_x_size(s), 160);
  const auto w = random_floats(conv_w_size(s), 161);
  const auto r = random_floats(conv_y_size(s), 162);
  const dvec xd = to_double(x), wd = to_double(w), rd = to_double(r);
  const auto want_y = conv_ref(s, xd, wd, nullptr);
  dvec gx, gw;  // too many elements for central differences to be quick
  conv_ref_backward(s, xd, wd, rd, gx, gw);
  for (int rep = 0; rep < 2; ++rep) {
    fvec y(conv_y_size(s)), dx(x.size()), dw(w.size());
    cpu::conv2d_forward(s, x.data(), w.data(), nullptr, y.data());
    cpu::conv2d_backward(s, x.data(), w.data(), r.data(), dx.data(), dw.data(), nullptr, false);
    check_near(y, want_y, 1e-5, "padded-channel conv forward");
    check_near(dx, gx, 1e-5, "padded-channel conv dx");
    check_near(dw, gw, 1e-5, "padded-channel conv dw");
    cpu::conv2d_forward(other, nan_x.data(), nan_w.data(), nullptr, ny.data());
    cpu::conv2d_backward(other, nan_x.data(), nan_w.data(), ny.data(), ndx.data(), ndw.data(),
                         nullptr, false);
  }
}

TEST_CASE("conv2d and pool2d on two threads at once: each thread its own primitives") {
  conv2d_shape s;
  s.batch = 4, s.in_channels = 3, s.in_h = 9, s.in_w = 8, s.out_channels = 16;
  s.kernel_h = s.kernel_w = 3, s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
  pool2d_shape p;
  p.batch = 4, p.channels = 16, p.in_h = 9, p.in_w = 8;
  p.kernel_h = p.kernel_w = p.stride_h = p.stride_w = 2;
  const auto w = random_floats(conv_w_size(s), 141);
  const dvec wd = to_double(w);
  int failures[2] = {0, 0};
  auto work = [&](int id) {
    const auto x = random_floats(conv_x_size(s), 150 + unsigned(id));
    const auto want = pool_ref(p, conv_ref(s, to_double(x), wd, nullptr)).y;
    fvec y(conv_y_size(s)), pooled(pool_y_size(p));
    std::vector<unsigned char> ws(cpu::pool2d_workspace_bytes(p));
    for (int rep = 0; rep < 20; ++rep) {
      cpu::conv2d_forward(s, x.data(), w.data(), nullptr, y.data());
      cpu::pool2d_forward(p, y.data(), pooled.data(), ws.data());
      for (std::size_t i = 0; i < want.size(); ++i)
        if (std::fabs(pooled[i] - want[i]) > 1e-5) ++failures[id];
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  CHECK(failures[0] == 0);
  CHECK(failures[1] == 0);
}

TEST_CASE(
    "pool2d: max with and without padding, ties to the first largest; avg excludes "
    "padding") {
  init_cpu_kernels();
  SUBCASE("max 2x2 stride 2, no padding, odd image (the last row and column dropped)") {
    pool2d_shape s;
    s.kind = pool_kind::max, s.batch = 3, s.channels = 5, s.in_h = 7, s.in_w = 9;
    s.kernel_h = s.kernel_w = 2, s.stride_h = s.stride_w = 2;
    check_pool(s, 50);
  }
  SUBCASE("max 3x2, stride 2x1 (overlapping windows), asymmetric padding") {
    pool2d_shape s;
    s.kind = pool_kind::max, s.batch = 3, s.channels = 5, s.in_h = 7, s.in_w = 9;
    s.kernel_h = 3, s.kernel_w = 2, s.stride_h = 2, s.stride_w = 1;
    s.pad_top = 1, s.pad_bottom = 2, s.pad_left = 0, s.pad_right = 1;
    check_pool(s, 60);
  }
  SUBCASE("32 channels (oneDNN's blocked layout): max and avg with overlapping windows") {
    pool2d_shape s;
    s.kind = pool_kind::max, s.batch = 2, s.channels = 32, s.in_h = 7, s.in_w = 5;
    s.kernel_h = 3, s.kernel_w = 2, s.stride_h = 2, s.stride_w = 1;
    s.pad_top = 1, s.pad_bottom = 2, s.pad_left = 0, s.pad_right = 1;
    check_pool(s, 61);
    s.kind = pool_kind::avg;
    check_pool(s, 62);
  }
  SUBCASE("max with padding and all-negative inputs: padding never wins") {
    pool2d_shape s;
    s.kind = pool_kind::max, s.batch = 1, s.channels = 16, s.in_h = 4, s.in_w = 4;
    s.kernel_h = s.kernel_w = 3, s.stride_h = s.stride_w = 2;
    s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
    auto x = random_floats(pool_x_size(s), 65, -2.0f, -1.0f);
    fvec y(pool_y_size(s));
    std::vector<unsigned char> ws(cpu::pool2d_workspace_bytes(s));
    cpu::pool2d_forward(s, x.data(), y.data(), ws.data());
    check_near(y, pool_ref(s, to_double(x)).y, 0, "max pool of negatives");
    for (float v : y) CHECK(v < -0.99f);
  }
  SUBCASE("avg 3x2, stride 2x1, padding excluded from the count") {
    pool2d_shape s;
    s.kind = pool_kind::avg, s.batch = 3, s.channels = 5, s.in_h = 7, s.in_w = 9;
    s.kernel_h = 3, s.kernel_w = 2, s.stride_h = 2, s.stride_w = 1;
    s.pad_top = 1, s.pad_bottom = 1, s.pad_left = 1, s.pad_right = 0;
    check_pool(s, 70);
    // The corner window covers 2x1 real pixels (and four padded ones).
    fvec x(pool_x_size(s), 0.0f), y(pool_y_size(s));
    x[0] = 4.0f, x[9] = 2.0f;  // (0,0) and (1,0) of the first image and channel
    cpu::pool2d_forward(s, x.data(), y.data(), nullptr);
    CHECK(y[0] == doctest::Approx(3.0));
  }
}

TEST_CASE("unary functions: forward against double references, backward against differences") {
  const std::size_t n = 257;
  auto x = random_floats(n, 80, -4.0f, 4.0f);
  for (auto& v : x)
    if (std::fabs(v) < 1e-2f) v = 0.5f;  // keep relu's kink out of the differences
  x[0] = 30.0f, x[1] = -30.0f;           // saturated sigmoid and tanh stay finite
  const auto dy = random_floats(n, 81);
  const float alpha = 0.07f;
  for (unary_op op :
       {unary_op::relu, unary_op::leaky_relu, unary_op::gelu, unary_op::tanh, unary_op::sigmoid}) {
    CAPTURE(static_cast<int>(op));
    fvec y(n), dx(n);
    cpu::unary_forward(op, alpha, x.data(), y.data(), n);
    dvec want(n), grad(n);
    for (std::size_t i = 0; i < n; ++i) {
      want[i] = unary_ref(op, alpha, x[i]);
      const double h = 1e-5;
      grad[i] = dy[i] * (unary_ref(op, alpha, x[i] + h) - unary_ref(op, alpha, x[i] - h)) / (2 * h);
    }
    check_near(y, want, 2e-6, "unary forward");
    cpu::unary_backward(op, alpha, x.data(), y.data(), dy.data(), dx.data(), n);
    check_near(dx, grad, 1e-5, "unary backward");
    fvec in_place = dy;  // dx may be dy
    cpu::unary_backward(op, alpha, x.data(), y.data(), in_place.data(), in_place.data(), n);
    CHECK(in_place == dx);
    // Each reads only what it needs: relu and leaky_relu either one.
    fvec only(n);
    if (op == unary_op::gelu) {
      cpu::unary_backward(op, alpha, x.data(), nullptr, dy.data(), only.data(), n);
      CHECK(only == dx);
      CHECK_THROWS_AS(cpu::unary_backward(op, alpha, nullptr, y.data(), dy.data(), only.data(), n),
                      std::invalid_argument);
    } else {
      cpu::unary_backward(op, alpha, nullptr, y.data(), dy.data(), only.data(), n);
      CHECK(only == dx);
    }
  }
}

TEST_CASE(
    "batch norm: sums -> statistics -> forward, and backward_sums -> backward, equal a "
    "naive double batch norm and its gradient") {
  const int64_t batch = 3, ch = 5, sp = 7;
  const std::size_t total = static_cast<std::size_t>(batch * ch * sp);
  const double count = double(batch * sp);
  const float eps = 1e-3f, momentum = 0.1f;
  auto x = random_floats(total, 90, -2.0f, 3.0f);
  for (std::size_t i = 0; i < total; ++i) x[i] += float(i % 5);  // channels with offsets
  const auto gamma = random_floats(ch, 91, 0.5f, 1.5f);
  const auto beta = random_floats(ch, 92);
  const auto r = random_floats(total, 93);
  const dvec xd = to_double(x), gd = to_double(gamma), bd = to_double(beta), rd = to_double(r);

  fvec sums(2 * ch), mean(ch), invstd(ch), y(total);
  fvec running_mean = random_floats(ch, 94), running_var = random_floats(ch, 95, 0.5f, 2.0f);
  const fvec rm0 = running_mean, rv0 = running_var;
  cpu::batch_norm_sums(x.data(), batch, ch, sp, sums.data());
  cpu::batch_norm_statistics(sums.data(), ch, count, eps, momentum, mean.data(), invstd.data(),
                             running_mean.data(), running_var.data());
  cpu::batch_norm_forward(x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), y.data(),
                          batch, ch, sp);
  check_near(y, bn_ref(xd, gd, bd, batch, ch, sp, eps), 2e-5, "batch norm forward");

  for (int64_t c = 0; c < ch; ++c) {
    double m = 0, v = 0;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < sp; ++i) m += xd[(n * ch + c) * sp + i];
    m /= count;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < sp; ++i) v += std::pow(xd[(n * ch + c) * sp + i] - m, 2);
    CHECK(mean[c] == doctest::Approx(m).epsilon(1e-6));
    CHECK(invstd[c] == doctest::Approx(1 / std::sqrt(v / count + eps)).epsilon(1e-5));
    CHECK(running_mean[c] == doctest::Approx(0.9 * rm0[c] + 0.1 * m).epsilon(1e-6));
    CHECK(running_var[c] == doctest::Approx(0.9 * rv0[c] + 0.1 * v / (count - 1)).epsilon(1e-5));
  }
  // Either running statistic alone.
  fvec rm_only = rm0, mean2(ch), invstd2(ch);
  cpu::batch_norm_statistics(sums.data(), ch, count, eps, momentum, mean2.data(), invstd2.data(),
                             rm_only.data(), nullptr);
  CHECK(rm_only == running_mean);
  CHECK(mean2 == mean);
  fvec var_in = {0.0f, 1.0f, 3.0f}, inv_out(3);
  cpu::invstd_from_variance(var_in.data(), eps, inv_out.data(), 3);
  for (int i = 0; i < 3; ++i)
    CHECK(inv_out[i] == doctest::Approx(1 / std::sqrt(double(var_in[i]) + eps)).epsilon(1e-6));

  fvec bsums(2 * ch), dx(total, 42.0f);
  cpu::batch_norm_backward_sums(x.data(), r.data(), mean.data(), invstd.data(), batch, ch, sp,
                                bsums.data());
  cpu::batch_norm_backward(x.data(), r.data(), mean.data(), invstd.data(), gamma.data(),
                           bsums.data(), count, dx.data(), batch, ch, sp);
  auto loss_x = [&](const dvec& p) { return dot(rd, bn_ref(p, gd, bd, batch, ch, sp, eps)); };
  auto loss_g = [&](const dvec& p) { return dot(rd, bn_ref(xd, p, bd, batch, ch, sp, eps)); };
  auto loss_b = [&](const dvec& p) { return dot(rd, bn_ref(xd, gd, p, batch, ch, sp, eps)); };
  check_near(dx, numeric_gradient(xd, loss_x), 1e-4, "batch norm dx");
  check_near(fvec(bsums.begin() + ch, bsums.end()), numeric_gradient(gd, loss_g), 1e-4,
             "batch norm dgamma (sum dy*xhat)");
  check_near(fvec(bsums.begin(), bsums.begin() + ch), numeric_gradient(bd, loss_b), 1e-5,
             "batch norm dbeta (sum dy)");

  // Evaluation: the running statistics through invstd_from_variance.
  fvec inv_run(ch), y_eval(total);
  cpu::invstd_from_variance(running_var.data(), eps, inv_run.data(), ch);
  cpu::batch_norm_forward(x.data(), running_mean.data(), inv_run.data(), gamma.data(), beta.data(),
                          y_eval.data(), batch, ch, sp);
  const std::size_t j = static_cast<std::size_t>((2 * ch + 3) * sp + 4);  // n 2, c 3
  CHECK(y_eval[j] ==
        doctest::Approx(
            (xd[j] - running_mean[3]) / std::sqrt(double(running_var[3]) + eps) * gd[3] + bd[3])
            .epsilon(1e-5));
}

TEST_CASE("batch norm synced over two replicas (their sums added) equals one device on the batch") {
  const int64_t batch = 6, ch = 3, sp = 5, half = 3;
  const std::size_t per = static_cast<std::size_t>(ch * sp);
  const std::size_t total = static_cast<std::size_t>(batch) * per;
  const float eps = 1e-5f;
  const auto x = random_floats(total, 170, -1.0f, 2.0f);
  const auto dy = random_floats(total, 171);
  const auto gamma = random_floats(ch, 172, 0.5f, 1.5f);
  const auto beta = random_floats(ch, 173);
  const double count = double(batch * sp);

  fvec sums(2 * ch), mean(ch), invstd(ch), y(total), bsums(2 * ch), dx(total);
  fvec rm(ch, 0.0f), rv(ch, 1.0f);
  cpu::batch_norm_sums(x.data(), batch, ch, sp, sums.data());
  cpu::batch_norm_statistics(sums.data(), ch, count, eps, 0.1f, mean.data(), invstd.data(),
                             rm.data(), rv.data());
  cpu::batch_norm_forward(x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), y.data(),
                          batch, ch, sp);
  cpu::batch_norm_backward_sums(x.data(), dy.data(), mean.data(), invstd.data(), batch, ch, sp,
                                bsums.data());
  cpu::batch_norm_backward(x.data(), dy.data(), mean.data(), invstd.data(), gamma.data(),
                           bsums.data(), count, dx.data(), batch, ch, sp);

  // Two replicas of three examples: local sums, all-reduced (added), then
  // each normalises its own rows with the group's statistics.
  fvec s0(2 * ch), s1(2 * ch), m2(ch), i2(ch), y2(total), b0(2 * ch), b1(2 * ch), dx2(total);
  fvec rm2(ch, 0.0f), rv2(ch, 1.0f);
  cpu::batch_norm_sums(x.data(), half, ch, sp, s0.data());
  cpu::batch_norm_sums(x.data() + half * per, half, ch, sp, s1.data());
  for (int64_t c = 0; c < 2 * ch; ++c) s0[c] += s1[c];
  cpu::batch_norm_statistics(s0.data(), ch, count, eps, 0.1f, m2.data(), i2.data(), rm2.data(),
                             rv2.data());
  for (int64_t r = 0; r < 2; ++r) {
    const std::size_t off = static_cast<std::size_t>(r * half) * per;
    cpu::batch_norm_forward(x.data() + off, m2.data(), i2.data(), gamma.data(), beta.data(),
                            y2.data() + off, half, ch, sp);
  }
  cpu::batch_norm_backward_sums(x.data(), dy.data(), m2.data(), i2.data(), half, ch, sp, b0.data());
  cpu::batch_norm_backward_sums(x.data() + half * per, dy.data() + half * per, m2.data(), i2.data(),
                                half, ch, sp, b1.data());
  for (int64_t c = 0; c < 2 * ch; ++c) b0[c] += b1[c];
  for (int64_t r = 0; r < 2; ++r) {
    const std::size_t off = static_cast<std::size_t>(r * half) * per;
    cpu::batch_norm_backward(x.data() + off, dy.data() + off, m2.data(), i2.data(), gamma.data(),
                             b0.data(), count, dx2.data() + off, half, ch, sp);
  }
  check_near(y2, dvec(y.begin(), y.end()), 1e-6, "synced forward");
  check_near(dx2, dvec(dx.begin(), dx.end()), 1e-5, "synced dx");
  check_near(b0, dvec(bsums.begin(), bsums.end()), 1e-5, "synced gamma and beta gradients");
  check_near(rv2, dvec(rv.begin(), rv.end()), 1e-6, "synced running variance");
}

TEST_CASE("layer norm: forward and backward against a naive double reference; accumulate") {
  const int64_t rows = 4, cols = 11;
  const std::size_t total = static_cast<std::size_t>(rows * cols);
  const float eps = 1e-5f;
  auto x = random_floats(total, 100, -1.0f, 2.0f);
  const auto gamma = random_floats(cols, 101, 0.5f, 1.5f);
  const auto beta = random_floats(cols, 102);
  const auto r = random_floats(total, 103);
  const dvec xd = to_double(x), gd = to_double(gamma), bd = to_double(beta), rd = to_double(r);
  fvec y(total), mean(rows), invstd(rows);
  cpu::layer_norm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), invstd.data(),
                          rows, cols, eps);
  check_near(y, ln_ref(xd, gd, bd, rows, cols, eps), 1e-5, "layer norm forward");
  fvec y_infer(total);  // inference keeps no statistics
  cpu::layer_norm_forward(x.data(), gamma.data(), beta.data(), y_infer.data(), nullptr, nullptr,
                          rows, cols, eps);
  CHECK(y_infer == y);
  fvec dx(total, 3.0f), dgamma(cols, 3.0f), dbeta(cols, 3.0f);
  cpu::layer_norm_backward(x.data(), r.data(), gamma.data(), mean.data(), invstd.data(), dx.data(),
                           dgamma.data(), dbeta.data(), rows, cols, false);
  const auto gx = numeric_gradient(
      xd, [&](const dvec& p) { return dot(rd, ln_ref(p, gd, bd, rows, cols, eps)); });
  const auto gg = numeric_gradient(
      gd, [&](const dvec& p) { return dot(rd, ln_ref(xd, p, bd, rows, cols, eps)); });
  const auto gb = numeric_gradient(
      bd, [&](const dvec& p) { return dot(rd, ln_ref(xd, gd, p, rows, cols, eps)); });
  check_near(dx, gx, 1e-4, "layer norm dx");
  check_near(dgamma, gg, 1e-5, "layer norm dgamma");
  check_near(dbeta, gb, 1e-5, "layer norm dbeta");
  cpu::layer_norm_backward(x.data(), r.data(), gamma.data(), mean.data(), invstd.data(), dx.data(),
                           dgamma.data(), dbeta.data(), rows, cols, true);
  dvec gg2(gg), gb2(gb);
  for (auto& v : gg2) v *= 2;
  for (auto& v : gb2) v *= 2;
  check_near(dgamma, gg2, 1e-5, "layer norm dgamma accumulated");
  check_near(dbeta, gb2, 1e-5, "layer norm dbeta accumulated");
}

TEST_CASE("dropout: the mask is a function of (seed, id, column), whatever the row split") {
  const int64_t rows = 6, cols = 37;
  const float rate = 0.4f;
  const uint64_t seed = 0x1234abcdULL;
  const auto x = random_floats(static_cast<std::size_t>(rows * cols), 110, 0.5f, 1.5f);
  const std::vector<int64_t> ids = {100, 7, 1000000007, 3, 4, 5};
  fvec whole(x.size()), split(x.size());
  cpu::dropout(x.data(), whole.data(), rows, cols, rate, seed, ids.data());
  cpu::dropout(x.data(), split.data(), 3, cols, rate, seed, ids.data());
  cpu::dropout(x.data() + 3 * cols, split.data() + 3 * cols, 3, cols, rate, seed, ids.data() + 3);
  CHECK(whole == split);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const std::size_t i = static_cast<std::size_t>(r * cols + j);
      const float want = dropout_keep(seed, ids[r], j, rate) ? x[i] / (1 - rate) : 0.0f;
      REQUIRE(whole[i] == doctest::Approx(want).epsilon(1e-7));
    }
  // Another seed draws another mask; rate 0 is the identity.
  fvec other(x.size()), same(x.size());
  cpu::dropout(x.data(), other.data(), rows, cols, rate, seed + 1, ids.data());
  CHECK(other != whole);
  cpu::dropout(x.data(), same.data(), rows, cols, 0.0f, seed, ids.data());
  CHECK(same == x);

  // About 1 - rate of a large batch kept, each scaled by 1 / (1 - rate).
  const int64_t big_rows = 64, big_cols = 1000;
  fvec ones(static_cast<std::size_t>(big_rows * big_cols), 1.0f), out(ones.size());
  std::vector<int64_t> big_ids(big_rows);
  for (int64_t r = 0; r < big_rows; ++r) big_ids[r] = r * 3 + 1;
  cpu::dropout(ones.data(), out.data(), big_rows, big_cols, 0.3f, seed, big_ids.data());
  std::size_t kept = 0;
  for (float v : out) {
    if (v != 0.0f) {
      ++kept;
      REQUIRE(v == doctest::Approx(1 / 0.7).epsilon(1e-7));
    }
  }
  CHECK(double(kept) / double(out.size()) == doctest::Approx(0.7).epsilon(0.02));
}

TEST_CASE("embedding: lookup, bag mean, and the scatter of the gradient") {
  const int64_t rows = 3, len = 4, vocab = 11, dim = 5;
  const fvec ids = {1, 4, 4, 10, 0, 3, 9, 1, 7, 7, 7, 2};  // repeats within and across rows
  const auto table = random_floats(static_cast<std::size_t>(vocab * dim), 120);
  const dvec td = to_double(table);
  auto lookup = [&](const dvec& t, bool bag) {
    dvec out(static_cast<std::size_t>(rows * (bag ? 1 : len) * dim), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t l = 0; l < len; ++l)
        for (int64_t j = 0; j < dim; ++j) {
          const double v = t[static_cast<std::size_t>(ids[r * len + l]) * dim + j];
          if (bag)
            out[r * dim + j] += v / double(len);
          else
            out[(r * len + l) * dim + j] = v;
        }
    return out;
  };
  for (bool bag : {false, true}) {
    CAPTURE(bag);
    fvec out(static_cast<std::size_t>(rows * (bag ? 1 : len) * dim), 9.0f);
    cpu::embedding_forward(ids.data(), table.data(), out.data(), rows, len, dim, bag);
    check_near(out, lookup(td, bag), 1e-6, "embedding forward");
    const auto r = random_floats(out.size(), 121);
    const dvec rd = to_double(r);
    fvec dtable(table.size(), 5.0f);
    cpu::embedding_backward(ids.data(), r.data(), dtable.data(), rows, len, vocab, dim, bag, false);
    const auto g = numeric_gradient(td, [&](const dvec& p) { return dot(rd, lookup(p, bag)); });
    check_near(dtable, g, 1e-5, "embedding dtable");
    CHECK(dtable[5 * dim] == 0.0f);  // id 5 appears nowhere
    cpu::embedding_backward(ids.data(), r.data(), dtable.data(), rows, len, vocab, dim, bag, true);
    dvec g2(g);
    for (auto& v : g2) v *= 2;
    check_near(dtable, g2, 1e-5, "embedding dtable accumulated");
  }
}

TEST_CASE("sigmoid cross-entropy: stable loss, gradient, correct count") {
  const int64_t batch = 4, outputs = 3;
  fvec z = {0.3f, -1.2f, 2.0f, 40.0f, -40.0f, 0.0f, -0.7f, 0.1f, 5.0f, 1.5f, -2.5f, 0.2f};
  fvec t = {1.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.5f, 0.0f, 1.0f, 0.3f, 1.0f, 0.0f, 1.0f};
  auto ref = [&](const dvec& p) {
    double l = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
      l += std::max(p[i], 0.0) - p[i] * t[i] + std::log1p(std::exp(-std::fabs(p[i])));
    return l;
  };
  const float scale = 0.25f;
  double loss = 1.5;
  int64_t correct = 10;
  fvec dz(z.size(), 9.0f);
  cpu::sigmoid_cross_entropy(z.data(), t.data(), batch, outputs, scale, dz.data(), &loss, &correct);
  CHECK(loss - 1.5 == doctest::Approx(ref(to_double(z))).epsilon(1e-6));
  // Rows 0, 1 and 3 have every output on the target's side (z 0 with t 0.5
  // counts: 0.5 is the lower side of both); row 2 has 5.0 for a target 0.3.
  CHECK(correct == 10 + 3);
  auto g = numeric_gradient(to_double(z), ref, 1e-5);
  for (auto& v : g) v *= scale;
  check_near(dz, g, 1e-5, "bce dlogits");
  CHECK(std::isfinite(loss));
  fvec alias = z;  // dlogits may be the logits
  cpu::sigmoid_cross_entropy(alias.data(), t.data(), batch, outputs, scale, alias.data(), &loss,
                             nullptr);
  CHECK(alias == dz);
}

TEST_CASE("mean squared error: per-example mean, gradient, adds to the sum") {
  const int64_t batch = 3, outputs = 5;
  const auto p = random_floats(15, 130);
  const auto t = random_floats(15, 131);
  auto ref = [&](const dvec& q) {
    double l = 0;
    for (std::size_t i = 0; i < q.size(); ++i) l += std::pow(q[i] - t[i], 2) / double(outputs);
    return l;
  };
  double loss = -2.0;
  fvec dp(15);
  cpu::mean_squared_error(p.data(), t.data(), batch, outputs, 0.5f, dp.data(), &loss);
  CHECK(loss + 2.0 == doctest::Approx(ref(to_double(p))).epsilon(1e-6));
  auto g = numeric_gradient(to_double(p), ref, 1e-5);
  for (auto& v : g) v *= 0.5;
  check_near(dp, g, 1e-5, "mse dpred");
}
