// Optimizer updates and learning-rate schedules against hand-computed values.
// Expected numbers come from the update formulas written out here in double
// (and a few literals), never from the code under test.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/lr_schedule.hpp"
#include "kernels/optimizer.hpp"
#include "messages/tensor.hpp"

using namespace troupe;
using namespace troupe::kernels;

namespace {

using dvec = std::vector<double>;
using fvec = std::vector<float>;

// The tiny problem: three weights, three steps of gradients.
const fvec w0 = {1.0f, -2.0f, 0.5f};
const std::vector<fvec> grads = {
    {0.1f, -0.2f, 0.3f},
    {0.4f, 0.1f, -0.5f},
    {-0.2f, 0.3f, 0.1f},
};

dvec to_d(const fvec& v) {
  return dvec(v.begin(), v.end());
}

void check_close(const fvec& got, const dvec& want, double eps = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(eps));
  }
}

optimizer_config make_cfg(const std::string& kind, double lr) {
  optimizer_config c;
  c.kind = kind;
  c.learning_rate = lr;
  return c;
}

// Runs the optimizer class for grads.size() steps on one variable "w".
fvec run_class(const optimizer_config& c, std::size_t steps = 3) {
  optimizer opt(c, 100);
  std::vector<named_tensor> vars = {{"w", tensor::from<float>({3}, w0)}};
  opt.init(vars);
  for (std::size_t s = 0; s < steps; ++s) {
    std::vector<named_tensor> g = {{"w/grad", tensor::from<float>({3}, grads[s])}};
    opt.apply(vars, g);
  }
  CHECK(opt.step() == static_cast<int64_t>(steps));
  auto sp = vars[0].value.span<float>();
  return fvec(sp.begin(), sp.end());
}

}  // namespace

TEST_CASE("sgd: hand-computed steps, L2 weight decay") {
  fvec w = w0;
  sgd_step(w.data(), grads[0].data(), 3, 0.1f, 0.0f);
  check_close(w, {0.99, -1.98, 0.47});
  sgd_step(w.data(), grads[1].data(), 3, 0.1f, 0.0f);
  check_close(w, {0.95, -1.99, 0.52});
  sgd_step(w.data(), grads[2].data(), 3, 0.1f, 0.0f);
  check_close(w, {0.97, -2.02, 0.51});

  // L2: w -= lr * (g + wd * w), wd = 0.5.
  fvec wd = w0;
  sgd_step(wd.data(), grads[0].data(), 3, 0.1f, 0.5f);
  check_close(wd, {1 - 0.1 * (0.1 + 0.5), -2 - 0.1 * (-0.2 - 1.0), 0.5 - 0.1 * (0.3 + 0.25)});
  check_close(wd, {0.94, -1.88, 0.445});

  check_close(run_class(make_cfg("sgd", 0.1)), {0.97, -2.02, 0.51});
}

TEST_CASE("momentum and nesterov: hand-computed steps") {
  const double lr = 0.1, mu = 0.9;
  // Plain: v = mu*v + g; w -= lr*v.
  {
    fvec w = w0, v(3, 0.0f);
    momentum_step(w.data(), v.data(), grads[0].data(), 3, 0.1f, 0.9f, false, 0.0f);
    check_close(w, {0.99, -1.98, 0.47});
    check_close(v, {0.1, -0.2, 0.3});
    momentum_step(w.data(), v.data(), grads[1].data(), 3, 0.1f, 0.9f, false, 0.0f);
    check_close(v, {0.49, -0.08, -0.23});
    check_close(w, {0.941, -1.972, 0.493});
    momentum_step(w.data(), v.data(), grads[2].data(), 3, 0.1f, 0.9f, false, 0.0f);
    check_close(v, {0.241, 0.228, -0.107});
    check_close(w, {0.9169, -1.9948, 0.5037});
  }
  // Nesterov: v = mu*v + g; w -= lr*(g + mu*v).
  {
    fvec w = w0, v(3, 0.0f);
    momentum_step(w.data(), v.data(), grads[0].data(), 3, 0.1f, 0.9f, true, 0.0f);
    check_close(w, {0.981, -1.962, 0.443});
    momentum_step(w.data(), v.data(), grads[1].data(), 3, 0.1f, 0.9f, true, 0.0f);
    check_close(w, {0.8969, -1.9648, 0.5137});
  }
  // Three steps of each with L2 decay against the formulas in double.
  for (bool nesterov : {false, true}) {
    CAPTURE(nesterov);
    const double wdk = 0.05;
    dvec rw = to_d(w0), rv(3, 0.0);
    fvec w = w0, v(3, 0.0f);
    for (const auto& g : grads) {
      for (int i = 0; i < 3; ++i) {
        const double gd = g[i] + wdk * rw[i];
        rv[i] = mu * rv[i] + gd;
        rw[i] -= nesterov ? lr * (gd + mu * rv[i]) : lr * rv[i];
      }
      momentum_step(w.data(), v.data(), g.data(), 3, 0.1f, 0.9f, nesterov, float(wdk));
    }
    check_close(w, rw);
    check_close(v, rv);

    auto c = make_cfg("momentum", lr);
    c.nesterov = nesterov;
    c.weight_decay = wdk;
    check_close(run_class(c), rw);
  }
}

TEST_CASE("adam: bias correction, L2 and decoupled weight decay") {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  // Step 1: mhat = g, vhat = g^2, so each weight moves by lr * sign(g).
  {
    fvec w = w0, m(3, 0.0f), v(3, 0.0f);
    adam_step(w.data(), m.data(), v.data(), grads[0].data(), 3, 0.01f, 0.9f, 0.999f, 1e-8f, 1, 0.0f,
              false);
    check_close(w, {0.99, -1.99, 0.49}, 1e-6);
    check_close(m, {0.01, -0.02, 0.03}, 1e-7);
    check_close(v, {1e-5, 4e-5, 9e-5}, 1e-8);  // 1 - 0.999f is 9.99987e-4 in float
  }
  // Decoupled, wd = 0.1, step 1: w -= lr*sign(g) + lr*wd*w.
  {
    fvec w = w0, m(3, 0.0f), v(3, 0.0f);
    adam_step(w.data(), m.data(), v.data(), grads[0].data(), 3, 0.01f, 0.9f, 0.999f, 1e-8f, 1, 0.1f,
              true);
    check_close(w, {0.989, -1.988, 0.4895}, 1e-6);
  }
  // Three steps, three weight-decay modes, against the formulas in double.
  struct mode {
    double wd;
    bool decoupled;
  };
  for (mode md : {mode{0.0, false}, mode{0.1, false}, mode{0.1, true}}) {
    CAPTURE(md.wd);
    CAPTURE(md.decoupled);
    dvec rw = to_d(w0), rm(3, 0.0), rv(3, 0.0);
    fvec w = w0, m(3, 0.0f), v(3, 0.0f);
    for (std::size_t s = 0; s < grads.size(); ++s) {
      const double t = double(s + 1);
      for (int i = 0; i < 3; ++i) {
        const double g = md.decoupled ? grads[s][i] : grads[s][i] + md.wd * rw[i];
        rm[i] = b1 * rm[i] + (1 - b1) * g;
        rv[i] = b2 * rv[i] + (1 - b2) * g * g;
        const double mhat = rm[i] / (1 - std::pow(b1, t));
        const double vhat = rv[i] / (1 - std::pow(b2, t));
        const double decay = md.decoupled ? lr * md.wd * rw[i] : 0.0;
        rw[i] = rw[i] - lr * mhat / (std::sqrt(vhat) + eps) - decay;
      }
      adam_step(w.data(), m.data(), v.data(), grads[s].data(), 3, 0.01f, 0.9f, 0.999f, 1e-8f,
                int64_t(s + 1), float(md.wd), md.decoupled);
    }
    check_close(w, rw);
    auto c = make_cfg("adam", lr);
    c.weight_decay = md.wd;
    c.decoupled_weight_decay = md.decoupled;
    check_close(run_class(c), rw);
  }
  // The step is 1-based: 0 would divide by a zero bias correction.
  fvec w = w0, m(3, 0.0f), v(3, 0.0f);
  CHECK_THROWS_AS(adam_step(w.data(), m.data(), v.data(), grads[0].data(), 3, 0.01f, 0.9f, 0.999f,
                            1e-8f, 0, 0.0f, false),
                  std::invalid_argument);
}

TEST_CASE("rmsprop: hand-computed steps") {
  const double lr = 0.01, rho = 0.9, eps = 1e-8;
  {
    // Step 1: ms = 0.1 g^2, so w -= lr * sign(g) / sqrt(0.1).
    fvec w = w0, ms(3, 0.0f);
    rmsprop_step(w.data(), ms.data(), grads[0].data(), 3, 0.01f, 0.9f, 1e-8f, 0.0f);
    const double d = 0.01 / std::sqrt(0.1);  // 0.0316227766
    check_close(w, {1 - d, -2 + d, 0.5 - d}, 1e-6);
    check_close(w, {0.9683772, -1.9683772, 0.4683772}, 1e-6);
    check_close(ms, {0.001, 0.004, 0.009}, 1e-8);
  }
  for (double wdk : {0.0, 0.2}) {
    CAPTURE(wdk);
    dvec rw = to_d(w0), rms(3, 0.0);
    fvec w = w0, ms(3, 0.0f);
    for (const auto& g : grads) {
      for (int i = 0; i < 3; ++i) {
        const double gd = g[i] + wdk * rw[i];
        rms[i] = rho * rms[i] + (1 - rho) * gd * gd;
        rw[i] -= lr * gd / (std::sqrt(rms[i]) + eps);
      }
      rmsprop_step(w.data(), ms.data(), g.data(), 3, 0.01f, 0.9f, 1e-8f, float(wdk));
    }
    check_close(w, rw);
    check_close(ms, rms, 1e-7);
    auto c = make_cfg("rmsprop", lr);
    c.weight_decay = wdk;
    check_close(run_class(c), rw);
  }
}

TEST_CASE("decoupled weight decay for sgd/momentum/rmsprop through the optimizer class") {
  const double lr = 0.1, wdk = 0.3, mu = 0.9;
  {
    // sgd: decoupled == L2 algebraically: w -= lr*wd*w + lr*g.
    dvec rw = to_d(w0);
    for (const auto& g : grads)
      for (int i = 0; i < 3; ++i) rw[i] = rw[i] - lr * wdk * rw[i] - lr * g[i];
    auto c = make_cfg("sgd", lr);
    c.weight_decay = wdk;
    c.decoupled_weight_decay = true;
    check_close(run_class(c), rw);
  }
  {
    // momentum: the decay does not enter v.
    dvec rw = to_d(w0), rv(3, 0.0);
    for (const auto& g : grads)
      for (int i = 0; i < 3; ++i) {
        rv[i] = mu * rv[i] + g[i];
        rw[i] = rw[i] - lr * wdk * rw[i] - lr * rv[i];
      }
    auto c = make_cfg("momentum", lr);
    c.weight_decay = wdk;
    c.decoupled_weight_decay = true;
    const fvec got = run_class(c);
    check_close(got, rw);
    // ... and differs from L2 momentum.
    c.decoupled_weight_decay = false;
    const fvec l2 = run_class(c);
    CHECK(std::fabs(l2[1] - got[1]) > 1e-3);
  }
  {
    const double rho = 0.9, eps = 1e-8, rlr = 0.01;
    dvec rw = to_d(w0), rms(3, 0.0);
    for (const auto& g : grads)
      for (int i = 0; i < 3; ++i) {
        rms[i] = rho * rms[i] + (1 - rho) * double(g[i]) * g[i];
        rw[i] = rw[i] - rlr * wdk * rw[i] - rlr * g[i] / (std::sqrt(rms[i]) + eps);
      }
    auto c = make_cfg("rmsprop", rlr);
    c.weight_decay = wdk;
    c.decoupled_weight_decay = true;
    check_close(run_class(c), rw);
  }
  // The free function alone.
  fvec w = w0;
  decoupled_decay_step(w.data(), 3, 0.1f, 0.5f);
  check_close(w, {0.95, -1.9, 0.475});
}

TEST_CASE("lr schedule: constant and step") {
  optimizer_config c;
  c.learning_rate = 0.5;
  c.schedule.kind = "constant";
  CHECK(learning_rate_at(c, 0, 100) == 0.5);
  CHECK(learning_rate_at(c, 99, 100) == 0.5);
  CHECK(learning_rate_at(c, 1000, 100) == 0.5);

  c.learning_rate = 1.0;
  c.schedule.kind = "step";
  c.schedule.step_size = 10;
  c.schedule.gamma = 0.5;
  CHECK(learning_rate_at(c, 0, 100) == doctest::Approx(1.0));
  CHECK(learning_rate_at(c, 9, 100) == doctest::Approx(1.0));
  CHECK(learning_rate_at(c, 10, 100) == doctest::Approx(0.5));
  CHECK(learning_rate_at(c, 19, 100) == doctest::Approx(0.5));
  CHECK(learning_rate_at(c, 25, 100) == doctest::Approx(0.25));
  CHECK(learning_rate_at(c, 30, 100) == doctest::Approx(0.125));
  c.schedule.step_size = 0;
  CHECK_THROWS_AS(learning_rate_at(c, 0, 100), std::invalid_argument);

  c.schedule.kind = "linear";
  CHECK_THROWS_AS(learning_rate_at(c, 0, 100), std::invalid_argument);
}

TEST_CASE("lr schedule: cosine endpoints, midpoint, clamp, decay_steps 0 = total") {
  optimizer_config c;
  c.learning_rate = 1.0;
  c.schedule.kind = "cosine";
  c.schedule.min_lr = 0.1;
  c.schedule.decay_steps = 100;
  CHECK(learning_rate_at(c, 0, 1000) == doctest::Approx(1.0));
  CHECK(learning_rate_at(c, 50, 1000) == doctest::Approx(0.55));  // (1 + 0.1) / 2
  // Quarter: 0.1 + 0.9 * (1 + cos(pi/4)) / 2
  CHECK(learning_rate_at(c, 25, 1000) ==
        doctest::Approx(0.1 + 0.9 * (1 + std::cos(std::numbers::pi / 4)) / 2));
  CHECK(learning_rate_at(c, 100, 1000) == doctest::Approx(0.1));
  CHECK(learning_rate_at(c, 150, 1000) == doctest::Approx(0.1));  // clamped after the end

  c.schedule.decay_steps = 0;  // horizon = total_steps
  CHECK(learning_rate_at(c, 0, 200) == doctest::Approx(1.0));
  CHECK(learning_rate_at(c, 100, 200) == doctest::Approx(0.55));
  CHECK(learning_rate_at(c, 200, 200) == doctest::Approx(0.1));
  // Monotone non-increasing.
  double prev = 2.0;
  for (int64_t s = 0; s <= 220; ++s) {
    const double lr = learning_rate_at(c, s, 200);
    CHECK(lr <= prev);
    prev = lr;
  }
}

TEST_CASE("lr schedule: linear warm-up, then the schedule on step - warmup") {
  optimizer_config c;
  c.learning_rate = 0.8;
  c.schedule.kind = "constant";
  c.schedule.warmup_steps = 4;
  CHECK(learning_rate_at(c, 0, 100) == doctest::Approx(0.2));
  CHECK(learning_rate_at(c, 1, 100) == doctest::Approx(0.4));
  CHECK(learning_rate_at(c, 2, 100) == doctest::Approx(0.6));
  CHECK(learning_rate_at(c, 3, 100) == doctest::Approx(0.8));
  CHECK(learning_rate_at(c, 4, 100) == doctest::Approx(0.8));
  CHECK(learning_rate_at(c, 50, 100) == doctest::Approx(0.8));

  c.learning_rate = 1.0;
  c.schedule.kind = "cosine";
  c.schedule.min_lr = 0.0;
  c.schedule.decay_steps = 10;
  CHECK(learning_rate_at(c, 0, 100) == doctest::Approx(0.25));
  CHECK(learning_rate_at(c, 3, 100) == doctest::Approx(1.0));
  CHECK(learning_rate_at(c, 4, 100) == doctest::Approx(1.0));   // cosine at 0
  CHECK(learning_rate_at(c, 9, 100) == doctest::Approx(0.5));   // cosine midpoint
  CHECK(learning_rate_at(c, 14, 100) == doctest::Approx(0.0));  // cosine end
  CHECK(learning_rate_at(c, 40, 100) == doctest::Approx(0.0));

  c.schedule.kind = "step";
  c.schedule.step_size = 2;
  c.schedule.gamma = 0.1;
  CHECK(learning_rate_at(c, 4, 100) == doctest::Approx(1.0));
  CHECK(learning_rate_at(c, 6, 100) == doctest::Approx(0.1));
}

TEST_CASE("optimizer class follows the schedule: current_lr and step") {
  auto c = make_cfg("sgd", 0.1);
  c.schedule.kind = "step";
  c.schedule.step_size = 2;
  c.schedule.gamma = 0.5;
  optimizer opt(c, 10);
  std::vector<named_tensor> vars = {{"w", tensor::from<float>({2}, {1.0f, 1.0f})}};
  const std::vector<named_tensor> g = {{"w", tensor::from<float>({2}, {1.0f, -1.0f})}};
  opt.init(vars);
  const double expect_lr[] = {0.1, 0.1, 0.05, 0.05, 0.025};
  double w = 1.0;
  for (int s = 0; s < 5; ++s) {
    CHECK(opt.step() == s);
    CHECK(opt.current_lr() == doctest::Approx(expect_lr[s]));
    opt.apply(vars, g);
    w -= expect_lr[s];
    CHECK(vars[0].value.f32()[0] == doctest::Approx(w));
    CHECK(vars[0].value.f32()[1] == doctest::Approx(2.0 - w));
  }
  CHECK(opt.step() == 5);
}

TEST_CASE("optimizer class: state() / load_state() resumes identically") {
  for (const char* kind : {"sgd", "momentum", "adam", "rmsprop"}) {
    CAPTURE(kind);
    auto c = make_cfg(kind, 0.05);
    c.nesterov = true;
    c.weight_decay = 0.01;
    c.schedule.kind = "cosine";
    c.schedule.warmup_steps = 2;
    const int64_t total = 8;
    auto make_vars = [] {
      return std::vector<named_tensor>{
          {"dense0/w", tensor::from<float>({2, 3}, {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f})},
          {"dense0/b", tensor::from<float>({3}, {0.0f, 0.1f, -0.1f})}};
    };
    auto grad_at = [](int64_t s) {
      const float f = 0.1f * float(s + 1);
      return std::vector<named_tensor>{
          {"dense0/w", tensor::from<float>({2, 3}, {f, -f, 0.5f, -0.3f, f * f, 0.2f})},
          {"dense0/b", tensor::from<float>({3}, {-f, 0.05f, f})}};
    };

    // Uninterrupted run of 6 steps.
    optimizer full(c, total);
    auto vfull = make_vars();
    full.init(vfull);
    for (int64_t s = 0; s < 6; ++s) full.apply(vfull, grad_at(s));

    // 3 steps, checkpoint, fresh optimizer, restore, 3 more steps.
    optimizer first(c, total);
    auto v = make_vars();
    first.init(v);
    for (int64_t s = 0; s < 3; ++s) first.apply(v, grad_at(s));
    auto st = first.state();
    std::vector<named_tensor> vsaved;
    for (const auto& x : v) vsaved.push_back({x.name, x.value.clone()});
    // state() hands out clones: continuing the first optimizer does not change it.
    first.apply(v, grad_at(3));

    optimizer second(c, total);
    second.init(vsaved);
    CHECK(second.step() == 0);
    second.load_state(st);
    CHECK(second.step() == 3);
    CHECK(second.current_lr() == learning_rate_at(c, 3, total));
    for (int64_t s = 3; s < 6; ++s) second.apply(vsaved, grad_at(s));
    CHECK(second.step() == 6);
    for (std::size_t i = 0; i < vfull.size(); ++i) {
      CAPTURE(vfull[i].name);
      CHECK(vsaved[i].value == vfull[i].value);  // bit-identical
    }
    auto s_full = full.state();
    auto s_second = second.state();
    REQUIRE(s_full.size() == s_second.size());
    for (std::size_t i = 0; i < s_full.size(); ++i) {
      CHECK(s_full[i].name == s_second[i].name);
      CHECK(s_full[i].value == s_second[i].value);
    }
  }
}

TEST_CASE("optimizer class: state() names and layout") {
  auto c = make_cfg("adam", 0.01);
  optimizer opt(c, 10);
  std::vector<named_tensor> vars = {{"a", tensor({2, 2})}, {"b", tensor({3})}};
  opt.init(vars);
  auto st = opt.state();
  REQUIRE(st.size() == 5);
  CHECK(st[0].name == "a/adam_m");
  CHECK(st[1].name == "a/adam_v");
  CHECK(st[2].name == "b/adam_m");
  CHECK(st[3].name == "b/adam_v");
  CHECK(st[4].name == "optimizer/step");
  CHECK(st[0].value.shape() == shape_t{2, 2});
  CHECK(st[3].value.shape() == shape_t{3});
  CHECK(st[4].value.type() == dtype::i64);
  CHECK(st[4].value.shape() == shape_t{1});
  CHECK(st[4].value.data<int64_t>()[0] == 0);
  for (float x : st[0].value.span<float>()) CHECK(x == 0.0f);

  optimizer mom(make_cfg("momentum", 0.1), 10);
  mom.init(vars);
  auto ms = mom.state();
  REQUIRE(ms.size() == 3);
  CHECK(ms[0].name == "a/momentum");
  optimizer rms(make_cfg("rmsprop", 0.1), 10);
  rms.init(vars);
  CHECK(rms.state()[1].name == "b/rms");
  optimizer sgd(make_cfg("sgd", 0.1), 10);
  sgd.init(vars);
  REQUIRE(sgd.state().size() == 1);
  CHECK(sgd.state()[0].name == "optimizer/step");
}

TEST_CASE("optimizer class: errors") {
  CHECK_THROWS_AS(optimizer(make_cfg("adagrad", 0.1), 10), std::invalid_argument);
  auto bad_sched = make_cfg("sgd", 0.1);
  bad_sched.schedule.kind = "exponential";
  CHECK_THROWS_AS(optimizer(bad_sched, 10), std::invalid_argument);

  optimizer opt(make_cfg("adam", 0.1), 10);
  std::vector<named_tensor> vars = {{"w", tensor::from<float>({2}, {1.0f, 2.0f})},
                                    {"b", tensor::from<float>({1}, {3.0f})}};
  opt.init(vars);
  const auto before0 = vars[0].value.clone();

  // Count mismatch.
  std::vector<named_tensor> one = {{"w", tensor({2})}};
  CHECK_THROWS_AS(opt.apply(vars, one), std::invalid_argument);
  // Shape mismatch (second gradient), nothing applied to the first variable.
  std::vector<named_tensor> bad_shape = {{"w", tensor::from<float>({2}, {1.0f, 1.0f})},
                                         {"b", tensor({2})}};
  CHECK_THROWS_AS(opt.apply(vars, bad_shape), std::invalid_argument);
  CHECK(vars[0].value == before0);
  // Wrong dtype.
  std::vector<named_tensor> bad_type = {{"w", tensor({2})}, {"b", tensor({1}, dtype::i32)}};
  CHECK_THROWS_AS(opt.apply(vars, bad_type), std::invalid_argument);
  // Variable list different from init().
  std::vector<named_tensor> other = {{"w", tensor({2})}};
  CHECK_THROWS_AS(opt.apply(other, one), std::invalid_argument);
  std::vector<named_tensor> renamed = {{"w", tensor({2})}, {"c", tensor({1})}};
  std::vector<named_tensor> two = {{"w", tensor({2})}, {"c", tensor({1})}};
  CHECK_THROWS_AS(opt.apply(renamed, two), std::invalid_argument);
  CHECK(opt.step() == 0);

  // load_state: missing and mis-shaped slots are named.
  std::vector<named_tensor> good = {{"w", tensor::from<float>({2}, {1.0f, 1.0f})},
                                    {"b", tensor::from<float>({1}, {1.0f})}};
  opt.apply(vars, good);
  auto st = opt.state();
  auto expect_error = [&](std::vector<named_tensor> s, const std::string& needle) {
    try {
      opt.load_state(s);
      FAIL("no throw for " << needle);
    } catch (const std::runtime_error& e) {
      CAPTURE(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  {
    auto s = st;
    s.erase(s.begin() + 3);  // b/adam_v
    expect_error(s, "b/adam_v");
  }
  {
    auto s = st;
    s[0].value = tensor({3});  // w/adam_m mis-shaped
    expect_error(s, "w/adam_m");
  }
  {
    auto s = st;
    s.pop_back();  // optimizer/step
    expect_error(s, "optimizer/step");
  }
  {
    auto s = st;
    s.back().value = tensor({1}, dtype::i32);
    expect_error(s, "optimizer/step");
  }
  CHECK(opt.step() == 1);  // failed loads changed nothing

  optimizer fresh(make_cfg("adam", 0.1), 10);
  CHECK_THROWS_AS(fresh.load_state(st), std::runtime_error);  // no init() yet
}

TEST_CASE("optimizer class: apply_ranges over disjoint shards equals apply, bit for bit") {
  for (const char* kind : {"sgd", "momentum", "adam", "rmsprop"}) {
    CAPTURE(kind);
    auto c = make_cfg(kind, 0.05);
    c.weight_decay = 0.01;
    c.decoupled_weight_decay = std::string(kind) == "adam";
    auto make_vars = [] {
      return std::vector<named_tensor>{
          {"dense0/w", tensor::from<float>({2, 3}, {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f})},
          {"dense0/b", tensor::from<float>({3}, {0.0f, 0.1f, -0.1f})}};
    };
    auto grads = std::vector<named_tensor>{
        {"dense0/w", tensor::from<float>({2, 3}, {0.3f, -0.1f, 0.5f, -0.3f, 0.2f, 0.2f})},
        {"dense0/b", tensor::from<float>({3}, {-0.4f, 0.05f, 0.7f})}};
    optimizer whole(c, 10);
    auto vw = make_vars();
    // Three "replicas" each update their segments (one crosses the variable
    // boundary at 6), then their segments are copied together.
    const std::vector<std::vector<std::pair<int64_t, int64_t>>> shards{
        {{0, 4}}, {{4, 7}}, {{7, 9}}};
    std::vector<optimizer> parts;
    std::vector<std::vector<named_tensor>> pv;
    for (std::size_t r = 0; r < shards.size(); ++r) {
      parts.emplace_back(c, 10);
      pv.push_back(make_vars());
    }
    for (int s = 0; s < 3; ++s) {
      whole.apply(vw, grads);
      for (std::size_t r = 0; r < shards.size(); ++r)
        parts[r].apply_ranges(pv[r], grads, shards[r]);
      // all-gather
      for (std::size_t r = 0; r < shards.size(); ++r)
        for (auto [a, b] : shards[r])
          for (int64_t i = a; i < b; ++i)
            for (auto& other : pv) {
              auto& dst = i < 6 ? other[0].value.f32()[i] : other[1].value.f32()[i - 6];
              dst = i < 6 ? pv[r][0].value.f32()[i] : pv[r][1].value.f32()[i - 6];
            }
    }
    for (std::size_t r = 0; r < shards.size(); ++r) {
      CHECK(parts[r].step() == 3);
      for (std::size_t i = 0; i < vw.size(); ++i) CHECK(pv[r][i].value == vw[i].value);
    }
    CHECK_THROWS_AS(parts[0].apply_ranges(pv[0], grads, {{5, 10}}), std::invalid_argument);
  }
}
