// The cuda:N device (devices/cuda_context.cpp) and the CUDA backend
// (kernels/cuda_backend.cu): every backend operation against the CPU backend
// on the same random data, and the context's contract (allocator, transfers,
// events, errors). Without a GPU it prints why and exits 77, which ctest
// counts as skipped (label gpu).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "devices/cuda_context.hpp"
#include "devices/device_context.hpp"
#include "kernels/backend.hpp"
#include "tests/cuda_fixtures.hpp"
#include "tests/device_fixtures.hpp"
#include "tests/fixtures.hpp"

extern char** environ;

using namespace troupe;
using troupe::test::random_floats;

namespace {

device_spec cuda0() {
  return device_spec{device_spec::kind_t::cuda, 0};
}

using troupe::test::gpu_fixture;

constexpr double ew_tol = 1e-5;    // element-wise
constexpr double gemm_tol = 1e-4;  // sums of products

struct dense_shape {
  int64_t batch, in, out;
};
const dense_shape dense_shapes[] = {{1, 1, 1},    {7, 13, 5}, {33, 100, 10}, {64, 784, 128},
                                    {256, 64, 3}, {0, 4, 3},  {5, 0, 3},     {5, 4, 0}};

std::string shape_str(const dense_shape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.in) + "->" + std::to_string(s.out);
}

std::size_t sz(int64_t a, int64_t b) {
  return static_cast<std::size_t>(a * b);
}

// The sticky-error check runs in a child process (this executable again):
// an illegal address ruins the process's CUDA context for good.
constexpr const char* sync_error_flag = "--sync-error-child";

int sync_error_child() {
  try {
    auto ctx = make_cuda_context(cuda0());
    // Address 0 is never device memory: the kernel faults asynchronously.
    ctx->ops().fill(nullptr, 1.0f, std::size_t{1} << 20);
    try {
      ctx->synchronize();
      std::fprintf(stderr, "child: synchronize did not throw\n");
      return 1;
    } catch (const device_error& e) {
      std::fprintf(stderr, "child: synchronize threw: %s\n", e.what());
      if (std::string(e.what()).find("cuda:0") == std::string::npos) return 2;
    }
    // Later calls keep failing with a device_error (the error is sticky),
    // and the context still tears down without throwing or crashing.
    try {
      std::vector<float> host(4);
      auto buf = ctx->allocate(16);
      ctx->copy_to_host(host.data(), buf.data(), 16);
      std::fprintf(stderr, "child: copy_to_host after the fault did not throw\n");
      return 3;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: copy_to_host after the fault threw: %s\n", e.what());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: unexpected exception: %s\n", e.what());
    return 4;
  }
  return 0;
}

}  // namespace

TEST_CASE("cuda context: identity, streams, refusals") {
  gpu_fixture f;
  CHECK(f.ctx->spec() == cuda0());
  CHECK_FALSE(f.ctx->shares_host_memory());
  CHECK(std::string(f.gpu.name()) == "cuda");
  CHECK(cuda_compute_stream(*f.ctx) != nullptr);
  // The factory gives the same kind of context.
  auto via_factory = make_device_context(cuda0());
  CHECK(cuda_compute_stream(*via_factory) != nullptr);
  auto cpu = make_device_context(device_spec{device_spec::kind_t::cpu, 0});
  CHECK_THROWS_AS(cuda_compute_stream(*cpu), device_error);
  const int n = cuda_device_count();
  CHECK_THROWS_WITH_AS(make_cuda_context(device_spec{device_spec::kind_t::cuda, n}),
                       doctest::Contains(("cuda:" + std::to_string(n)).c_str()), device_error);
}

TEST_CASE("cuda context: a prepared device is taken by the next context of that device") {
  CHECK_FALSE(cuda_device_prepared(0));
  prepare_cuda_device(cuda0(), true);
  CHECK(cuda_device_prepared(0));
  auto taken = make_cuda_context(cuda0());
  CHECK_FALSE(cuda_device_prepared(0));
  // It computes as a fresh one does.
  auto& ops = taken->ops();
  auto y = allocate_array<float>(*taken, 4);
  ops.fill(static_cast<float*>(y.data()), 2.5f, 4);
  std::vector<float> back(4);
  taken->copy_to_host(back.data(), y.data(), 4 * sizeof(float));
  CHECK(back == std::vector<float>(4, 2.5f));
  // One left untaken is released, not leaked past the process's end.
  prepare_cuda_device(cuda0(), false);
  release_prepared_cuda_devices();
  CHECK_FALSE(cuda_device_prepared(0));
}

TEST_CASE("dense products with TF32 allowed stay within TF32's rounding of the CPU") {
  gpu_fixture f;
  f.gpu.use_tf32({true, true});
  using troupe::kernels::activation;
  const dense_shape s{64, 784, 128};
  auto x = random_floats(sz(s.batch, s.in), 301), w = random_floats(sz(s.in, s.out), 302),
       b = random_floats(static_cast<std::size_t>(s.out), 303);
  std::vector<float> y_cpu(sz(s.batch, s.out));
  f.cpu.dense_forward(x.data(), w.data(), b.data(), y_cpu.data(), s.batch, s.in, s.out,
                      activation::relu);
  auto dx = f.upload(x), dw = f.upload(w), db = f.upload(b);
  auto dy = f.upload(std::vector<float>(y_cpu.size(), 0.0f));
  f.gpu.dense_forward(dx.f32(), dw.f32(), db.f32(), dy.f32(), s.batch, s.in, s.out,
                      activation::relu);
  CHECK_CLOSE(f.download(dy, y_cpu.size()), y_cpu, 1e-2);
}

TEST_CASE("dense_forward matches the CPU, with each fused activation") {
  gpu_fixture f;
  unsigned seed = 1;
  using troupe::kernels::activation;
  for (const auto& s : dense_shapes)
    for (bool bias : {true, false})
      for (auto act : {activation::none, activation::relu, activation::tanh}) {
        INFO(shape_str(s) << (bias ? " with bias" : " without bias") << " activation "
                          << static_cast<int>(act));
        auto x = random_floats(sz(s.batch, s.in), seed++);
        auto w = random_floats(sz(s.in, s.out), seed++);
        auto b = random_floats(static_cast<std::size_t>(s.out), seed++);
        std::vector<float> y_cpu(sz(s.batch, s.out), 777.0f);
        f.cpu.dense_forward(x.data(), w.data(), bias ? b.data() : nullptr, y_cpu.data(), s.batch,
                            s.in, s.out, act);
        auto dx = f.upload(x), dw = f.upload(w), db = f.upload(b);
        auto dy = f.upload(std::vector<float>(y_cpu.size(), std::nanf("")));  // must not be read
        f.gpu.dense_forward(dx.f32(), dw.f32(), bias ? db.f32() : nullptr, dy.f32(), s.batch, s.in,
                            s.out, act);
        CHECK_CLOSE(f.download(dy, y_cpu.size()), y_cpu, gemm_tol);
      }
  f.ctx->synchronize();
}

TEST_CASE("activation_backward_bias matches the CPU") {
  gpu_fixture f;
  using troupe::kernels::activation;
  for (const auto& s : dense_shapes)
    for (auto act : {activation::none, activation::relu, activation::tanh})
      for (bool accumulate : {false, true}) {
        INFO(shape_str(s) << " activation " << static_cast<int>(act) << " accumulate "
                          << accumulate);
        auto y = random_floats(sz(s.batch, s.out), 90);
        auto dy = random_floats(sz(s.batch, s.out), 91);
        auto db0 = random_floats(static_cast<std::size_t>(s.out), 92);
        std::vector<float> dx_cpu(dy.size()), db_cpu = db0;
        f.cpu.activation_backward_bias(act, y.data(), dy.data(), dx_cpu.data(), db_cpu.data(),
                                       s.batch, s.out, accumulate);
        auto gy = f.upload(y), gdy = f.upload(dy), gdb = f.upload(db0);
        auto gdx = f.upload(std::vector<float>(dy.size(), std::nanf("")));
        f.gpu.activation_backward_bias(act, gy.f32(), gdy.f32(), gdx.f32(), gdb.f32(), s.batch,
                                       s.out, accumulate);
        CHECK_CLOSE(f.download(gdx, dx_cpu.size()), dx_cpu, ew_tol);
        CHECK_CLOSE(f.download(gdb, db_cpu.size()), db_cpu, gemm_tol);
      }
  f.ctx->synchronize();
}

TEST_CASE("dense_backward matches the CPU, overwriting and accumulating") {
  gpu_fixture f;
  unsigned seed = 100;
  for (const auto& s : dense_shapes)
    for (bool accumulate : {false, true})
      for (bool all_outputs : {true, false}) {
        INFO(shape_str(s) << (accumulate ? " accumulate" : " overwrite")
                          << (all_outputs ? " dx,dw,db" : " dw only"));
        auto x = random_floats(sz(s.batch, s.in), seed++);
        auto w = random_floats(sz(s.in, s.out), seed++);
        auto dy = random_floats(sz(s.batch, s.out), seed++);
        // Accumulating adds to these; overwriting must not read them (NaN on
        // the GPU would show).
        auto dw0 = random_floats(sz(s.in, s.out), seed++);
        auto db0 = random_floats(static_cast<std::size_t>(s.out), seed++);
        std::vector<float> dx_cpu(sz(s.batch, s.in), 777.0f);
        std::vector<float> dw_cpu = accumulate ? dw0 : std::vector<float>(dw0.size(), 777.0f);
        std::vector<float> db_cpu = accumulate ? db0 : std::vector<float>(db0.size(), 777.0f);
        f.cpu.dense_backward(x.data(), w.data(), dy.data(), all_outputs ? dx_cpu.data() : nullptr,
                             dw_cpu.data(), all_outputs ? db_cpu.data() : nullptr, s.batch, s.in,
                             s.out, accumulate);

        const float nan = std::nanf("");
        auto gx = f.upload(x), gw = f.upload(w), gdy = f.upload(dy);
        auto gdx = f.upload(std::vector<float>(dx_cpu.size(), nan));
        auto gdw = f.upload(accumulate ? dw0 : std::vector<float>(dw0.size(), nan));
        auto gdb = f.upload(accumulate ? db0 : std::vector<float>(db0.size(), nan));
        f.gpu.dense_backward(gx.f32(), gw.f32(), gdy.f32(), all_outputs ? gdx.f32() : nullptr,
                             gdw.f32(), all_outputs ? gdb.f32() : nullptr, s.batch, s.in, s.out,
                             accumulate);
        CHECK_CLOSE(f.download(gdw, dw_cpu.size()), dw_cpu, gemm_tol);
        if (all_outputs) {
          CHECK_CLOSE(f.download(gdx, dx_cpu.size()), dx_cpu, gemm_tol);
          CHECK_CLOSE(f.download(gdb, db_cpu.size()), db_cpu, gemm_tol);
        } else {  // untouched
          auto untouched_db = f.download(gdb, db_cpu.size());
          CHECK_CLOSE(untouched_db, accumulate ? db0 : std::vector<float>(db0.size(), nan), 0.0);
        }
      }
  f.ctx->synchronize();
}

TEST_CASE("activations match the CPU") {
  gpu_fixture f;
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, (std::size_t{1} << 20) + 3}) {
    INFO("n = " << n);
    auto x = random_floats(n, 7, -3.0f, 3.0f);
    x[0] = 0.0f;  // relu's boundary
    auto dy = random_floats(n, 8);
    std::vector<float> y(n), dx(n);
    auto gx = f.upload(x), gdy = f.upload(dy);
    auto gy = f.ctx->allocate(n * sizeof(float)), gdx = f.ctx->allocate(n * sizeof(float));

    f.cpu.relu_forward(x.data(), y.data(), n);
    f.gpu.relu_forward(gx.f32(), gy.f32(), n);
    CHECK_CLOSE(f.download(gy, n), y, 0.0);
    f.cpu.relu_backward(y.data(), dy.data(), dx.data(), n);
    f.gpu.relu_backward(gy.f32(), gdy.f32(), gdx.f32(), n);
    CHECK_CLOSE(f.download(gdx, n), dx, 0.0);

    f.cpu.tanh_forward(x.data(), y.data(), n);
    f.gpu.tanh_forward(gx.f32(), gy.f32(), n);
    CHECK_CLOSE(f.download(gy, n), y, ew_tol);
    f.ctx->copy_to_device(gy.data(), y.data(), n * sizeof(float));  // same input for backward
    f.cpu.tanh_backward(y.data(), dy.data(), dx.data(), n);
    f.gpu.tanh_backward(gy.f32(), gdy.f32(), gdx.f32(), n);
    CHECK_CLOSE(f.download(gdx, n), dx, ew_tol);
  }
}

namespace {

struct ce_result {
  std::vector<float> dlogits;
  double loss = 0;
  int64_t correct = 0;
};

// Runs softmax_cross_entropy `calls` times on each backend (the stats add
// up), into separate dlogits or in place (dlogits aliasing logits) or none.
enum class dl_mode { separate, in_place, none };

std::pair<ce_result, ce_result> run_ce(gpu_fixture& f, const std::vector<float>& logits,
                                       const std::vector<int32_t>& labels, int64_t classes,
                                       float grad_scale, dl_mode mode, int calls = 1) {
  const auto batch = static_cast<int64_t>(labels.size());
  ce_result c, g;
  std::vector<float> cpu_logits = logits;
  c.dlogits.assign(logits.size(), 0.0f);
  for (int i = 0; i < calls; ++i) {
    float* dl = mode == dl_mode::separate   ? c.dlogits.data()
                : mode == dl_mode::in_place ? cpu_logits.data()
                                            : nullptr;
    f.cpu.softmax_cross_entropy(cpu_logits.data(), labels.data(), batch, classes, grad_scale, dl,
                                &c.loss, &c.correct);
  }
  if (mode == dl_mode::in_place) c.dlogits = cpu_logits;

  auto gl = f.upload(logits);
  auto glab = f.upload(labels);
  auto gdl = f.ctx->allocate(logits.size() * sizeof(float));
  auto gstats = f.ctx->allocate(sizeof(double) + sizeof(int64_t));
  auto* loss = gstats.as<double>();
  auto* correct = reinterpret_cast<int64_t*>(gstats.as<unsigned char>() + sizeof(double));
  f.gpu.fill_stats(loss, correct);
  for (int i = 0; i < calls; ++i) {
    float* dl = mode == dl_mode::separate   ? gdl.f32()
                : mode == dl_mode::in_place ? gl.f32()
                                            : nullptr;
    f.gpu.softmax_cross_entropy(gl.f32(), glab.as<int32_t>(), batch, classes, grad_scale, dl, loss,
                                correct);
  }
  if (mode != dl_mode::none)
    g.dlogits = f.download(mode == dl_mode::separate ? gdl : gl, logits.size());
  else
    g.dlogits.assign(logits.size(), 0.0f);
  f.ctx->copy_to_host(&g.loss, loss, sizeof(double));
  f.ctx->copy_to_host(&g.correct, correct, sizeof(int64_t));
  return {c, g};
}

// The CPU's argmax: the first maximum (index 0 when l[0] is NaN).
int32_t first_argmax(const float* l, int64_t classes) {
  int32_t arg = 0;
  for (int64_t j = 1; j < classes; ++j)
    if (l[j] > l[arg]) arg = static_cast<int32_t>(j);
  return arg;
}

std::vector<int32_t> random_labels(int64_t batch, int64_t classes, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(classes - 1));
  std::vector<int32_t> v(static_cast<std::size_t>(batch));
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("softmax_cross_entropy matches the CPU: gradient, loss, correct count") {
  gpu_fixture f;
  unsigned seed = 1000;
  for (int64_t batch : {1, 37, 300})
    for (int64_t classes : {1, 2, 10, 33, 100}) {
      auto logits = random_floats(sz(batch, classes), seed++, -5.0f, 5.0f);
      auto labels = random_labels(batch, classes, seed++);
      // Some rows predicted right, so the count is not trivially 0.
      for (int64_t r = 0; r < batch; r += 3)
        labels[static_cast<std::size_t>(r)] = first_argmax(&logits[sz(r, classes)], classes);
      const float scale = 1.0f / static_cast<float>(batch);
      for (auto mode : {dl_mode::separate, dl_mode::in_place, dl_mode::none}) {
        INFO("batch " << batch << ", classes " << classes << ", mode " << static_cast<int>(mode));
        auto [c, g] = run_ce(f, logits, labels, classes, scale, mode);
        CHECK_CLOSE(g.dlogits, c.dlogits, ew_tol);
        CHECK(g.loss == doctest::Approx(c.loss).epsilon(1e-6));
        CHECK(g.correct == c.correct);
      }
    }
  {  // the stats add up over calls, from fill_stats' zeros
    auto logits = random_floats(sz(50, 10), 5, -5.0f, 5.0f);
    auto labels = random_labels(50, 10, 6);
    auto [c, g] = run_ce(f, logits, labels, 10, 0.5f, dl_mode::none, 3);
    CHECK(g.loss == doctest::Approx(c.loss).epsilon(1e-6));
    CHECK(g.correct == c.correct);
  }
  {  // large logits stay finite
    std::vector<float> logits = {1e30f, -1e30f, 0.0f, 88.0f, 89.0f, -200.0f};
    std::vector<int32_t> labels = {1, 2};
    auto [c, g] = run_ce(f, logits, labels, 3, 1.0f, dl_mode::separate);
    CHECK(std::isfinite(c.loss));
    CHECK(g.loss == doctest::Approx(c.loss).epsilon(1e-6));
    CHECK_CLOSE(g.dlogits, c.dlogits, ew_tol);
  }
}

TEST_CASE("softmax_cross_entropy: argmax ties and NaN pick the CPU's index") {
  gpu_fixture f;
  const int64_t batch = 500;
  for (int64_t classes : {3, 10, 70}) {
    INFO("classes " << classes);
    // Values from {0, 1, 2}: most rows have tied maxima.
    std::mt19937 rng(static_cast<unsigned>(classes));
    std::uniform_int_distribution<int> u(0, 2);
    std::vector<float> logits(sz(batch, classes));
    for (auto& x : logits) x = static_cast<float>(u(rng));
    std::vector<int32_t> first(static_cast<std::size_t>(batch)), last(first.size());
    for (int64_t r = 0; r < batch; ++r) {
      const float* l = &logits[sz(r, classes)];
      const int32_t a = first_argmax(l, classes);
      int32_t b = a;
      for (int64_t j = 0; j < classes; ++j)
        if (l[j] == l[a]) b = static_cast<int32_t>(j);
      first[static_cast<std::size_t>(r)] = a;
      last[static_cast<std::size_t>(r)] = b;
    }
    auto [c1, g1] = run_ce(f, logits, first, classes, 1.0f, dl_mode::none);
    CHECK(c1.correct == batch);
    CHECK(g1.correct == batch);
    auto [c2, g2] = run_ce(f, logits, last, classes, 1.0f, dl_mode::none);
    CHECK(c2.correct < batch);
    CHECK(g2.correct == c2.correct);

    // NaN in some rows, at index 0 in some of them: the count follows the CPU's scan.
    std::vector<float> with_nan = logits;
    for (int64_t r = 0; r < batch; r += 4) {
      const std::size_t j = static_cast<std::size_t>((r / 4) % classes);
      with_nan[sz(r, classes) + j] = std::nanf("");
    }
    std::vector<int32_t> nan_labels(first.size());
    for (int64_t r = 0; r < batch; ++r)
      nan_labels[static_cast<std::size_t>(r)] = first_argmax(&with_nan[sz(r, classes)], classes);
    auto [c3, g3] = run_ce(f, with_nan, nan_labels, classes, 1.0f, dl_mode::none);
    CHECK(c3.correct == batch);
    CHECK(g3.correct == c3.correct);
  }
}

TEST_CASE("fill, fill_stats, copy, add_inplace, scale_inplace") {
  gpu_fixture f;
  const std::size_t n = 100003;
  auto a = random_floats(n, 11), b = random_floats(n, 12);
  auto ga = f.upload(a), gb = f.upload(b);

  f.gpu.add_inplace(ga.f32(), gb.f32(), n);
  f.cpu.add_inplace(a.data(), b.data(), n);
  CHECK_CLOSE(f.download(ga, n), a, 0.0);

  f.gpu.scale_inplace(ga.f32(), 0.37f, n);
  f.cpu.scale_inplace(a.data(), 0.37f, n);
  CHECK_CLOSE(f.download(ga, n), a, 0.0);

  f.gpu.copy(gb.f32(), ga.f32(), n);
  f.gpu.copy(gb.f32(), gb.f32(), n);  // in place: nothing
  f.gpu.copy(gb.f32(), ga.f32(), 0);
  CHECK_CLOSE(f.download(gb, n), a, 0.0);

  f.gpu.fill(ga.f32() + 1, -2.5f, n - 2);
  auto filled = f.download(ga, n);
  CHECK(filled[0] == a[0]);
  CHECK(filled[n - 1] == a[n - 1]);
  CHECK(std::all_of(filled.begin() + 1, filled.end() - 1, [](float v) { return v == -2.5f; }));

  auto stats = f.upload(std::vector<int64_t>{-1, 42});  // garbage: a double's bytes and a count
  f.gpu.fill_stats(stats.as<double>(), stats.as<int64_t>() + 1);
  double loss = 1;
  int64_t correct = 1;
  f.ctx->copy_to_host(&loss, stats.as<double>(), sizeof loss);
  f.ctx->copy_to_host(&correct, stats.as<int64_t>() + 1, sizeof correct);
  CHECK(loss == 0.0);
  CHECK(correct == 0);
}

TEST_CASE("optimizer steps match the CPU over several steps") {
  gpu_fixture f;
  const std::size_t n = 5000;
  enum kind_t { sgd, momentum, nesterov, adam, adamw, rmsprop, decay };
  const char* names[] = {"sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "decay"};
  for (int k = sgd; k <= decay; ++k)
    for (float wd : {0.0f, 0.01f}) {
      INFO(names[k] << ", weight decay " << wd);
      auto w = random_floats(n, 20 + static_cast<unsigned>(k));
      std::vector<float> s1(n, 0.0f), s2(n, 0.0f);
      auto gw = f.upload(w), gs1 = f.upload(s1), gs2 = f.upload(s2);
      for (int step = 1; step <= 4; ++step) {
        auto g = random_floats(n, 200 + static_cast<unsigned>(step));
        auto gg = f.upload(g);
        const float lr = 0.01f;
        switch (k) {
          case sgd:
            f.cpu.sgd_step(w.data(), g.data(), n, lr, wd);
            f.gpu.sgd_step(gw.f32(), gg.f32(), n, lr, wd);
            break;
          case momentum:
          case nesterov:
            f.cpu.momentum_step(w.data(), s1.data(), g.data(), n, lr, 0.9f, k == nesterov, wd);
            f.gpu.momentum_step(gw.f32(), gs1.f32(), gg.f32(), n, lr, 0.9f, k == nesterov, wd);
            break;
          case adam:
          case adamw:
            f.cpu.adam_step(w.data(), s1.data(), s2.data(), g.data(), n, lr, 0.9f, 0.999f, 1e-8f,
                            step, wd, k == adamw);
            f.gpu.adam_step(gw.f32(), gs1.f32(), gs2.f32(), gg.f32(), n, lr, 0.9f, 0.999f, 1e-8f,
                            step, wd, k == adamw);
            break;
          case rmsprop:
            f.cpu.rmsprop_step(w.data(), s1.data(), g.data(), n, lr, 0.9f, 1e-7f, wd);
            f.gpu.rmsprop_step(gw.f32(), gs1.f32(), gg.f32(), n, lr, 0.9f, 1e-7f, wd);
            break;
          case decay:
            f.cpu.decoupled_decay_step(w.data(), n, lr, 0.5f + wd);
            f.gpu.decoupled_decay_step(gw.f32(), n, lr, 0.5f + wd);
            break;
        }
      }
      CHECK_CLOSE(f.download(gw, n), w, ew_tol);
      CHECK_CLOSE(f.download(gs1, n), s1, ew_tol);
      CHECK_CLOSE(f.download(gs2, n), s2, ew_tol);
    }
  auto w = f.ctx->allocate(16);
  CHECK_THROWS_AS(f.gpu.adam_step(w.f32(), w.f32(), w.f32(), w.f32(), 4, 0.1f, 0.9f, 0.999f, 1e-8f,
                                  0, 0.0f, false),
                  std::invalid_argument);
}

TEST_CASE("cuda context: the allocator reuses a freed block of the same size") {
  gpu_fixture f;
  const auto before = f.ctx->memory_stats();
  void* first = nullptr;
  {
    auto a = f.ctx->allocate(1000);
    first = a.data();
    CHECK(first != nullptr);
  }
  auto after_one = f.ctx->memory_stats();
  CHECK(after_one.raw_allocations == before.raw_allocations + 1);
  CHECK(after_one.bytes_in_use == before.bytes_in_use);
  auto b = f.ctx->allocate(1000);
  auto after_two = f.ctx->memory_stats();
  CHECK(after_two.cache_hits == after_one.cache_hits + 1);
  CHECK(after_two.raw_allocations == after_one.raw_allocations);
  CHECK(b.data() == first);
  auto z1 = f.ctx->allocate(0), z2 = f.ctx->allocate(0);
  CHECK(z1.data() != nullptr);
  CHECK(z1.data() != z2.data());
}

TEST_CASE("cuda context: copies to the device and back, staged so the source is free at once") {
  gpu_fixture f;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{513}, std::size_t{4} << 20}) {
    INFO(bytes << " bytes");
    std::vector<unsigned char> src(bytes), back(bytes, 0);
    for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
    auto buf = f.ctx->allocate(bytes);
    const auto t0 = f.ctx->transfers();
    f.ctx->copy_to_device(buf.data(), src.data(), bytes);
    f.ctx->copy_to_host(back.data(), buf.data(), bytes);
    CHECK(back == src);
    const auto t1 = f.ctx->transfers();
    CHECK(t1.uploads == t0.uploads + 1);
    CHECK(t1.downloads == t0.downloads + 1);
    CHECK(t1.bytes_up == t0.bytes_up + bytes);
    CHECK(t1.bytes_down == t0.bytes_down + bytes);
  }
  // Many copies queued behind slow compute, each from the same host vector
  // overwritten right after: each must land with its own contents (the
  // staging blocks, all of one size class, are not reused while in flight).
  const std::size_t n = 1 << 18;
  const int64_t dim = 4096;  // a few 4096^3 products: milliseconds of compute queued first
  auto x = f.ctx->allocate(sz(dim, dim) * sizeof(float));
  auto y = f.ctx->allocate(sz(dim, dim) * sizeof(float));
  f.gpu.fill(x.f32(), 0.001f, sz(dim, dim));
  for (int i = 0; i < 4; ++i)
    f.gpu.dense_forward(x.f32(), x.f32(), nullptr, y.f32(), dim, dim, dim,
                        troupe::kernels::activation::none);
  std::vector<device_buffer> dst;
  std::vector<float> src(n);
  for (int k = 0; k < 32; ++k) {
    std::fill(src.begin(), src.end(), static_cast<float>(k));
    dst.push_back(f.ctx->allocate(n * sizeof(float)));
    f.ctx->copy_to_device(dst.back().data(), src.data(), n * sizeof(float));
  }
  std::fill(src.begin(), src.end(), -1.0f);
  for (int k = 0; k < 32; ++k) {
    auto got = f.download(dst[static_cast<std::size_t>(k)], n);
    INFO("copy " << k);
    CHECK(std::all_of(got.begin(), got.end(), [&](float v) { return v == static_cast<float>(k); }));
  }
  f.ctx->synchronize();
}

TEST_CASE("cuda context: upload_async, then compute that waits for it sees the data") {
  gpu_fixture f;
  const std::size_t n = 4 << 20;  // 16 MiB
  auto busy = f.ctx->allocate(n * sizeof(float));
  f.gpu.fill(busy.f32(), 0.0f, n);
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    std::vector<float> src(n);
    for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>((i + round) % 1000);
    const std::vector<float> expected = src;
    auto dst = f.ctx->allocate(n * sizeof(float));
    auto out = f.ctx->allocate(n * sizeof(float));
    f.gpu.fill(out.f32(), 0.0f, n);
    for (int i = 0; i < 20; ++i) f.gpu.scale_inplace(busy.f32(), 1.0f, n);  // compute runs long
    auto e = f.ctx->upload_async(dst.data(), src.data(), n * sizeof(float));
    std::fill(src.begin(), src.end(), -1.0f);  // staged: the source is free
    f.ctx->wait(e);
    f.gpu.add_inplace(out.f32(), dst.f32(), n);  // reads the upload on the compute stream
    if (round == 2) e.reset();                   // an event dropped before its copy is done
    CHECK(f.download(out, n) == expected);
    if (e) CHECK(e->done());
  }
  auto e0 = f.ctx->upload_async(busy.data(), nullptr, 0);
  f.ctx->synchronize();
  CHECK(e0->done());
  CHECK(f.ctx->transfers().uploads >= 4);
}

TEST_CASE("cuda context: an upload into a block just given back waits for the compute reading it") {
  // The caching allocator hands a freed block out again at once (reuse is
  // ordered on the compute stream); an upload runs on the copy stream, so it
  // must wait for the compute queued before it or it overwrites what that
  // compute still reads.
  gpu_fixture f;
  const int64_t dim = 4096;
  const std::size_t n = sz(dim, dim);
  auto y = f.ctx->allocate(n * sizeof(float));
  void* recycled = nullptr;
  {
    auto a = f.ctx->allocate(n * sizeof(float));
    recycled = a.data();
    f.gpu.fill(a.f32(), 1.0f, n);
    // y = a * a, 16 times over (~45 ms of FP32 GEMM on an H100): every
    // element is exactly 4096 if `a` stays all ones while they run.
    for (int i = 0; i < 16; ++i)
      f.gpu.dense_forward(a.f32(), a.f32(), nullptr, y.f32(), dim, dim, dim,
                          troupe::kernels::activation::none);
  }
  auto b = f.ctx->allocate(n * sizeof(float));
  REQUIRE(b.data() == recycled);  // the premise: the same block, still read by the GEMMs
  const std::vector<float> twos(n, 2.0f);
  auto e = f.ctx->upload_async(b.data(), twos.data(), n * sizeof(float));
  f.ctx->wait(e);
  const auto got = f.download(y, n);
  const auto wrong = std::count_if(got.begin(), got.end(), [](float v) { return v != 4096.0f; });
  CHECK_MESSAGE(wrong == 0, wrong << " elements of the GEMM saw the upload");
  CHECK(f.download(b, n) == twos);
}

TEST_CASE("cuda context: synchronize surfaces an asynchronous kernel fault as device_error") {
  // In a child process: the fault ruins this process's CUDA context.
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(len > 0);
  self[len] = '\0';
  char flag[64];
  std::snprintf(flag, sizeof flag, "%s", sync_error_flag);
  char* argv[] = {self, flag, nullptr};
  // The fault must come asynchronously: with launches made blocking (a common
  // debugging setting) it would surface at the launch instead.
  unsetenv("CUDA_LAUNCH_BLOCKING");
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, self, nullptr, nullptr, argv, environ) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // see the child's stderr for which check failed
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], sync_error_flag) == 0) return sync_error_child();
  return troupe::test::gpu_test_main(argc, argv);
}
