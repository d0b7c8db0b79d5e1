// CPU kernels against naive references and numerical gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu_kernels.hpp"
#include "kernels/elementwise.hpp"
#include "tests/fixtures.hpp"

using namespace troupe::kernels;
using troupe::test::random_floats;

namespace {

// Naive y = x w + b in double.
std::vector<double> naive_dense(const std::vector<float>& x, const std::vector<float>& w,
                                const float* b, int64_t batch, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<std::size_t>(batch * out));
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t j = 0; j < out; ++j) {
      double s = b ? b[j] : 0.0;
      for (int64_t k = 0; k < in; ++k) s += double(x[r * in + k]) * double(w[k * out + j]);
      y[r * out + j] = s;
    }
  return y;
}

// Scalar loss L = sum(y * r) with y = dense_forward(x, w, b).
double dense_loss(const std::vector<float>& x, const std::vector<float>& w,
                  const std::vector<float>& b, const std::vector<float>& r, int64_t batch,
                  int64_t in, int64_t out) {
  std::vector<float> y(static_cast<std::size_t>(batch * out));
  dense_forward(x.data(), w.data(), b.data(), y.data(), batch, in, out);
  double l = 0;
  for (std::size_t i = 0; i < y.size(); ++i) l += double(y[i]) * double(r[i]);
  return l;
}

// Central difference of f with respect to p[i]; uses the step actually
// representable in float.
template <class F>
double numerical(std::vector<float>& p, std::size_t i, float h, F f) {
  const float orig = p[i];
  const float plus = orig + h;
  const float minus = orig - h;
  p[i] = plus;
  const double lp = f();
  p[i] = minus;
  const double lm = f();
  p[i] = orig;
  return (lp - lm) / (double(plus) - double(minus));
}

double sm_loss(const std::vector<float>& logits, const std::vector<int32_t>& labels, int64_t batch,
               int64_t classes) {
  return softmax_cross_entropy(logits.data(), labels.data(), batch, classes, 1.0f, nullptr,
                               nullptr);
}

}  // namespace

TEST_CASE("dense_forward matches a naive triple loop, with and without bias") {
  init_cpu_kernels();
  init_cpu_kernels();  // idempotent
  const int64_t batch = 5, in = 7, out = 4;
  auto x = random_floats(batch * in, 1);
  auto w = random_floats(in * out, 2);
  auto b = random_floats(out, 3);
  std::vector<float> y(batch * out, 123.0f);

  dense_forward(x.data(), w.data(), b.data(), y.data(), batch, in, out);
  auto ref = naive_dense(x, w, b.data(), batch, in, out);
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(ref[i]).epsilon(1e-5));

  std::fill(y.begin(), y.end(), 123.0f);
  dense_forward(x.data(), w.data(), nullptr, y.data(), batch, in, out);
  ref = naive_dense(x, w, nullptr, batch, in, out);
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(ref[i]).epsilon(1e-5));

  // A hand-checked 1x2 * 2x2 case: [1 2] [[1 2][3 4]] + [10 20] = [17 30].
  const float xs[] = {1, 2}, ws[] = {1, 2, 3, 4}, bs[] = {10, 20};
  float ys[2];
  dense_forward(xs, ws, bs, ys, 1, 2, 2);
  CHECK(ys[0] == 17.0f);
  CHECK(ys[1] == 30.0f);
}

TEST_CASE("dense_backward matches central differences of sum(y*r)") {
  const int64_t batch = 4, in = 5, out = 3;
  auto x = random_floats(batch * in, 11);
  auto w = random_floats(in * out, 12);
  auto b = random_floats(out, 13);
  auto r = random_floats(batch * out, 14);  // dL/dy = r

  std::vector<float> dx(batch * in), dw(in * out), db(out);
  dense_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), batch, in, out);

  // L is linear in each parameter, so the central difference is exact up to
  // float rounding of the forward pass: tolerance 1e-3 (abs + rel).
  const float h = 1e-2f;
  const double tol = 1e-3;
  auto loss = [&] { return dense_loss(x, w, b, r, batch, in, out); };
  for (std::size_t i = 0; i < w.size(); ++i)
    CHECK(dw[i] == doctest::Approx(numerical(w, i, h, loss)).epsilon(tol));
  for (std::size_t i = 0; i < b.size(); ++i)
    CHECK(db[i] == doctest::Approx(numerical(b, i, h, loss)).epsilon(tol));
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(dx[i] == doctest::Approx(numerical(x, i, h, loss)).epsilon(tol));

  // Exact small case: x=[1 2], dy=[1 -1], w=[[1 2][3 4]]:
  // dw = x^T dy = [[1 -1][2 -2]], db = [1 -1], dx = dy w^T = [-1 -1].
  const float xs[] = {1, 2}, ws[] = {1, 2, 3, 4}, dys[] = {1, -1};
  float dxs[2], dws[4], dbs[2];
  dense_backward(xs, ws, dys, dxs, dws, dbs, 1, 2, 2);
  CHECK(dws[0] == 1.0f);
  CHECK(dws[1] == -1.0f);
  CHECK(dws[2] == 2.0f);
  CHECK(dws[3] == -2.0f);
  CHECK(dbs[0] == 1.0f);
  CHECK(dbs[1] == -1.0f);
  CHECK(dxs[0] == -1.0f);
  CHECK(dxs[1] == -1.0f);
}

TEST_CASE("dense_backward: accumulate adds to dw/db; dx and db may be null") {
  const int64_t batch = 3, in = 4, out = 2;
  auto x = random_floats(batch * in, 21);
  auto w = random_floats(in * out, 22);
  auto dy = random_floats(batch * out, 23);

  std::vector<float> dw1(in * out, 99.0f), db1(out, 99.0f), dx1(batch * in, 99.0f);
  dense_backward(x.data(), w.data(), dy.data(), dx1.data(), dw1.data(), db1.data(), batch, in,
                 out);  // overwrites the 99s

  std::vector<float> dw2(dw1), db2(db1), dx2(batch * in, 99.0f);
  dense_backward(x.data(), w.data(), dy.data(), dx2.data(), dw2.data(), db2.data(), batch, in, out,
                 /*accumulate=*/true);
  for (std::size_t i = 0; i < dw1.size(); ++i)
    CHECK(dw2[i] == doctest::Approx(2.0 * dw1[i]).epsilon(1e-6));
  for (std::size_t i = 0; i < db1.size(); ++i)
    CHECK(db2[i] == doctest::Approx(2.0 * db1[i]).epsilon(1e-6));
  for (std::size_t i = 0; i < dx1.size(); ++i) CHECK(dx2[i] == dx1[i]);  // dx is not accumulated

  // Null dx and db: dw still computed.
  std::vector<float> dw3(in * out, 5.0f);
  dense_backward(x.data(), w.data(), dy.data(), nullptr, dw3.data(), nullptr, batch, in, out);
  for (std::size_t i = 0; i < dw1.size(); ++i) CHECK(dw3[i] == dw1[i]);
}

TEST_CASE("relu forward/backward") {
  const float x[] = {-2.0f, -0.0f, 0.5f, 3.0f};
  float y[4];
  relu_forward(x, y, 4);
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == 0.0f);
  CHECK(y[2] == 0.5f);
  CHECK(y[3] == 3.0f);

  // Numerical check on sum(relu(x) * r), away from the kink.
  auto xv = random_floats(50, 31);
  for (auto& v : xv)
    if (std::fabs(v) < 0.1f) v = v < 0 ? -0.5f : 0.5f;
  auto r = random_floats(50, 32);
  std::vector<float> yv(50), dx(50);
  relu_forward(xv.data(), yv.data(), 50);
  relu_backward(yv.data(), r.data(), dx.data(), 50);
  auto loss = [&] {
    std::vector<float> t(50);
    relu_forward(xv.data(), t.data(), 50);
    double l = 0;
    for (int i = 0; i < 50; ++i) l += double(t[i]) * r[i];
    return l;
  };
  int active = 0;
  for (std::size_t i = 0; i < 50; ++i) {
    CHECK(dx[i] == doctest::Approx(numerical(xv, i, 1e-2f, loss)).epsilon(1e-4));
    active += xv[i] > 0;
  }
  CHECK(active > 0);
  CHECK(active < 50);
}

namespace {
// One element through the dispatched tanh loop.
float tanh_forward_one(float x) {
  float y = 0;
  tanh_forward(&x, &y, 1);
  return y;
}
}  // namespace

// ew::tanh_f is a rational approximation (kernels/elementwise.hpp): within
// 4e-7 of tanh relative to it over a sweep of the float line, odd, exact at
// 0, never past +-1, saturated far out, NaN kept.
TEST_CASE("tanh: the rational approximation against double tanh") {
  double worst = 0;
  for (double x = -20.0; x <= 20.0; x += 1.0 / 4096) {
    const float f = static_cast<float>(x);
    const float y = tanh_forward_one(f);
    const double t = std::tanh(static_cast<double>(f));
    if (t != 0) worst = std::max(worst, std::abs(y - t) / std::abs(t));
    CHECK(std::abs(y) <= 1.0f);
    CHECK(tanh_forward_one(-f) == -y);
  }
  for (float tiny : {1e-30f, 1e-10f, 3e-4f, -2e-4f})
    CHECK(std::abs(tanh_forward_one(tiny) - std::tanh(double(tiny))) <= 1e-7 * std::abs(tiny));
  MESSAGE("max relative error " << worst);
  CHECK(worst < 4e-7);
  CHECK(tanh_forward_one(0.0f) == 0.0f);
  CHECK(tanh_forward_one(30.0f) == 1.0f);
  CHECK(tanh_forward_one(-1e30f) == -1.0f);
  CHECK(std::isnan(tanh_forward_one(std::nanf(""))));
}

TEST_CASE("tanh forward/backward") {
  auto x = random_floats(40, 41, -3.0f, 3.0f);
  auto r = random_floats(40, 42);
  std::vector<float> y(40), dx(40);
  tanh_forward(x.data(), y.data(), 40);
  for (std::size_t i = 0; i < 40; ++i) CHECK(y[i] == doctest::Approx(std::tanh(double(x[i]))));
  tanh_backward(y.data(), r.data(), dx.data(), 40);
  auto loss = [&] {
    std::vector<float> t(40);
    tanh_forward(x.data(), t.data(), 40);
    double l = 0;
    for (int i = 0; i < 40; ++i) l += double(t[i]) * r[i];
    return l;
  };
  // Central difference with h = 1e-3: truncation O(h^2) and float rounding
  // ~1e-4; tolerance 1e-3.
  for (std::size_t i = 0; i < 40; ++i)
    CHECK(dx[i] == doctest::Approx(numerical(x, i, 1e-3f, loss)).epsilon(1e-3));
  // d tanh(0) = 1.
  const float z = 0.0f, one = 1.0f;
  float yz, dz;
  tanh_forward(&z, &yz, 1);
  tanh_backward(&yz, &one, &dz, 1);
  CHECK(dz == 1.0f);
}

TEST_CASE("softmax_cross_entropy: hand-computed 2x3 loss and gradient") {
  // Row 0: logits [1 2 3], label 2; row 1: [1 1 1], label 0.
  const std::vector<float> logits = {1, 2, 3, 1, 1, 1};
  const std::vector<int32_t> labels = {2, 0};
  std::vector<float> d(6);
  int64_t correct = 0;
  const double loss =
      softmax_cross_entropy(logits.data(), labels.data(), 2, 3, 1.0f, d.data(), &correct);
  const double z0 = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const double expect = (std::log(z0) - 3.0) + std::log(3.0);
  CHECK(expect == doctest::Approx(1.5062182).epsilon(1e-6));  // 0.4076060 + 1.0986123
  CHECK(loss == doctest::Approx(expect).epsilon(1e-6));
  // Row 0 argmax 2 == label; row 1 is a three-way tie -> index 0 == label.
  CHECK(correct == 2);
  CHECK(d[0] == doctest::Approx(std::exp(1.0) / z0));
  CHECK(d[1] == doctest::Approx(std::exp(2.0) / z0));
  CHECK(d[2] == doctest::Approx(std::exp(3.0) / z0 - 1.0));
  CHECK(d[3] == doctest::Approx(1.0 / 3.0 - 1.0));
  CHECK(d[4] == doctest::Approx(1.0 / 3.0));
  CHECK(d[5] == doctest::Approx(1.0 / 3.0));
}

TEST_CASE("softmax_cross_entropy: gradient matches numerical differentiation") {
  const int64_t batch = 4, classes = 5;
  auto logits = random_floats(batch * classes, 51, -2.0f, 2.0f);
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  std::vector<float> d(batch * classes);
  softmax_cross_entropy(logits.data(), labels.data(), batch, classes, 1.0f, d.data(), nullptr);
  auto loss = [&] { return sm_loss(logits, labels, batch, classes); };
  // Central difference h = 1e-3: tolerance 1e-3.
  for (std::size_t i = 0; i < logits.size(); ++i)
    CHECK(d[i] == doctest::Approx(numerical(logits, i, 1e-3f, loss)).epsilon(1e-3));
  // Each row of (softmax - onehot) sums to zero.
  for (int64_t r = 0; r < batch; ++r) {
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += d[r * classes + c];
    CHECK(std::fabs(s) < 1e-6);
  }
}

TEST_CASE("softmax_cross_entropy: stable with logits of 1e4") {
  const std::vector<float> logits = {1e4f, 0.0f, -1e4f,  // label 0: loss ~ 0
                                     1e4f, 0.0f, -1e4f,  // label 1: loss = 1e4
                                     1e4f, 1e4f, 1e4f};  // label 2: loss = log 3
  const std::vector<int32_t> labels = {0, 1, 2};
  std::vector<float> d(9);
  int64_t correct = 0;
  const double loss =
      softmax_cross_entropy(logits.data(), labels.data(), 3, 3, 1.0f, d.data(), &correct);
  REQUIRE(std::isfinite(loss));
  CHECK(loss == doctest::Approx(1e4 + std::log(3.0)).epsilon(1e-9));
  for (float v : d) CHECK(std::isfinite(v));
  CHECK(d[0] == doctest::Approx(0.0));
  CHECK(d[3] == doctest::Approx(1.0));
  CHECK(d[4] == doctest::Approx(-1.0));
  CHECK(d[8] == doctest::Approx(1.0 / 3.0 - 1.0));
  CHECK(correct == 1);  // row 0 right, row 1 wrong, row 2 tie -> index 0 != 2
}

TEST_CASE("softmax_cross_entropy: correct count adds, grad_scale, aliasing, null outputs") {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 3.0f, 0.0f, 1.0f};
  const std::vector<int32_t> labels = {2, 1};
  int64_t correct = 10;
  std::vector<float> d1(6), d2(6);
  const double l1 =
      softmax_cross_entropy(logits.data(), labels.data(), 2, 3, 1.0f, d1.data(), &correct);
  CHECK(correct == 11);  // row 0 right (argmax 2), row 1 wrong (argmax 0)
  const double l2 =
      softmax_cross_entropy(logits.data(), labels.data(), 2, 3, 0.25f, d2.data(), nullptr);
  CHECK(l1 == l2);  // the loss is not scaled
  for (int i = 0; i < 6; ++i) CHECK(d2[i] == doctest::Approx(0.25 * d1[i]).epsilon(1e-6));

  std::vector<float> inplace = logits;
  const double l3 =
      softmax_cross_entropy(inplace.data(), labels.data(), 2, 3, 1.0f, inplace.data(), nullptr);
  CHECK(l3 == l1);
  for (int i = 0; i < 6; ++i) CHECK(inplace[i] == d1[i]);

  CHECK(softmax_cross_entropy(logits.data(), labels.data(), 2, 3, 1.0f, nullptr, nullptr) == l1);
  CHECK(softmax_cross_entropy(logits.data(), labels.data(), 0, 3, 1.0f, nullptr, nullptr) == 0.0);
}

TEST_CASE("softmax_cross_entropy: a bad label throws, naming label and row") {
  const std::vector<float> logits = {0, 1, 2, 3, 4, 5};
  std::vector<float> d(6, 7.0f);
  const std::vector<int32_t> too_big = {0, 3};
  const std::vector<int32_t> negative = {-1, 0};
  CHECK_THROWS_AS(
      softmax_cross_entropy(logits.data(), too_big.data(), 2, 3, 1.0f, d.data(), nullptr),
      std::out_of_range);
  try {
    softmax_cross_entropy(logits.data(), too_big.data(), 2, 3, 1.0f, d.data(), nullptr);
    FAIL("no throw");
  } catch (const std::out_of_range& e) {
    const std::string msg = e.what();
    CHECK(msg.find("label 3") != std::string::npos);
    CHECK(msg.find("row 1") != std::string::npos);
  }
  CHECK_THROWS_AS(
      softmax_cross_entropy(logits.data(), negative.data(), 2, 3, 1.0f, d.data(), nullptr),
      std::out_of_range);
  for (float v : d) CHECK(v == 7.0f);  // nothing written before the throw
}

TEST_CASE("reductions") {
  const float x[] = {3.0f, -1.5f, 4.0f, 0.25f, -7.0f};
  CHECK(reduce_sum(x, 5) == doctest::Approx(-1.25));
  CHECK(reduce_mean(x, 5) == doctest::Approx(-0.25));
  CHECK(reduce_min(x, 5) == -7.0f);
  CHECK(reduce_max(x, 5) == 4.0f);
  CHECK(reduce_min(x, 1) == 3.0f);
  CHECK(reduce_max(x + 4, 1) == -7.0f);
  CHECK(reduce_sum(x, 0) == 0.0);
  CHECK_THROWS_AS(reduce_min(x, 0), std::invalid_argument);
  CHECK_THROWS_AS(reduce_max(x, 0), std::invalid_argument);

  // Accumulated in double: a float accumulator drifts far from this.
  const std::size_t n = 10'000'000;
  std::vector<float> tenth(n, 0.1f);
  const double exact = double(0.1f) * double(n);
  CHECK(std::fabs(reduce_sum(tenth.data(), n) - exact) < 1e-2);  // float: ~8.8e4 off
  CHECK(std::fabs(reduce_mean(tenth.data(), n) - double(0.1f)) < 1e-10);
  // Max/min found anywhere in a long vector.
  auto big = random_floats(1001, 61);
  big[777] = 5.0f;
  big[3] = -5.0f;
  CHECK(reduce_max(big.data(), big.size()) == 5.0f);
  CHECK(reduce_min(big.data(), big.size()) == -5.0f);
}

TEST_CASE("add/scale/min/max in place") {
  std::vector<float> acc = {1, -2, 3, -4, 5};
  const std::vector<float> x = {0.5f, 1, -6, -1, 5};
  auto a = acc;
  add_inplace(a.data(), x.data(), a.size());
  CHECK(a == std::vector<float>{1.5f, -1, -3, -5, 10});
  scale_inplace(a.data(), -2.0f, a.size());
  CHECK(a == std::vector<float>{-3, 2, 6, 10, -20});
  auto mn = acc;
  min_inplace(mn.data(), x.data(), mn.size());
  CHECK(mn == std::vector<float>{0.5f, -2, -6, -4, 5});
  auto mx = acc;
  max_inplace(mx.data(), x.data(), mx.size());
  CHECK(mx == std::vector<float>{1, 1, 3, -1, 5});
  // n = 0 touches nothing.
  add_inplace(a.data(), x.data(), 0);
  CHECK(a == std::vector<float>{-3, 2, 6, 10, -20});
}

TEST_CASE("elementwise functions used by both CPU and CUDA paths") {
  CHECK(ew::relu(-1.0f) == 0.0f);
  CHECK(ew::relu(2.0f) == 2.0f);
  CHECK(ew::relu_grad(0.0f, 5.0f) == 0.0f);
  CHECK(ew::relu_grad(0.1f, 5.0f) == 5.0f);
  CHECK(ew::tanh_grad(0.5f, 2.0f) == doctest::Approx(2.0 * (1.0 - 0.25)));
  CHECK(ew::min_f(1.0f, -1.0f) == -1.0f);
  CHECK(ew::max_f(1.0f, -1.0f) == 1.0f);
}
