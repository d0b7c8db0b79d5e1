// The dispatched CPU kernels: every level's loops (kernels/vector_kernels.hpp)
// against scalar references on odd sizes and unaligned pointers, the levels
// against each other, oneDNN's products against a double-precision loop, and
// the choice of level (TROUPE_CPU_ISA; ctest also runs this file and
// test_kernels with the level forced down: tests/CMakeLists.txt).
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu_kernels.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/onednn.hpp"
#include "kernels/vector_kernels.hpp"
#include "tests/fixtures.hpp"
#include "tests/skip.hpp"

using namespace troupe::kernels;
using troupe::test::random_floats;

namespace {

const std::size_t kSizes[] = {1, 7, 33, 1000};

// Every level this CPU can run.
std::vector<const vector_kernels*> levels() {
  std::vector<const vector_kernels*> out;
  for (int l = 0; l <= static_cast<int>(cpu_isa::avx512); ++l)
    if (auto* t = vector_kernels_for(static_cast<cpu_isa>(l))) out.push_back(t);
  return out;
}

// A copy of v starting one float past a 64-byte boundary: no vector loop may
// assume alignment.
struct unaligned {
  std::vector<float> storage;
  float* p;
  explicit unaligned(const std::vector<float>& v) : storage(v.size() + 32) {
    auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    std::size_t skip = ((64 - addr % 64) % 64) / sizeof(float) + 1;
    p = storage.data() + skip;
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  }
  std::vector<float> get(std::size_t n) const { return {p, p + n}; }
};

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the active level is the widest the CPU has, unless TROUPE_CPU_ISA forces one lower") {
  const char* env = std::getenv("TROUPE_CPU_ISA");
  if (env && *env) {
    auto want = parse_isa(env);
    REQUIRE(want.has_value());
    CHECK(active_isa() == *want);
    const bool named =
        describe_cpu_kernels(false).find("forced by TROUPE_CPU_ISA") != std::string::npos;
    CHECK(named == (*want != detected_isa()));
  } else {
    CHECK(active_isa() == detected_isa());
  }
  CHECK(&active_vector_kernels() == vector_kernels_for(active_isa()));
  CHECK(active_vector_kernels().isa == active_isa());
  // oneDNN is capped at the same level: no AVX-512 code below avx512.
  const std::string dnnl_isa = onednn::effective_isa();
  if (active_isa() != cpu_isa::avx512) CHECK(dnnl_isa.find("avx512") == std::string::npos);
  if (active_isa() == cpu_isa::baseline) CHECK(dnnl_isa == "sse41");
  if (active_isa() == cpu_isa::avx512) CHECK(dnnl_isa.find("avx512") != std::string::npos);
  // Levels above the CPU's have no table.
  for (int l = static_cast<int>(detected_isa()) + 1; l <= static_cast<int>(cpu_isa::avx512); ++l)
    CHECK(vector_kernels_for(static_cast<cpu_isa>(l)) == nullptr);
  CHECK(vector_kernels_for(cpu_isa::baseline) != nullptr);
}

TEST_CASE("parse_isa knows the three levels and nothing else") {
  CHECK(parse_isa("baseline") == cpu_isa::baseline);
  CHECK(parse_isa("avx2") == cpu_isa::avx2);
  CHECK(parse_isa("avx512") == cpu_isa::avx512);
  CHECK_FALSE(parse_isa("AVX2").has_value());
  CHECK_FALSE(parse_isa("sse4").has_value());
  CHECK_FALSE(parse_isa("").has_value());
  CHECK(std::string(isa_name(cpu_isa::avx2)) == "avx2");
}

TEST_CASE("element-wise loops equal the scalar code bit for bit at every level") {
  for (const auto* k : levels()) {
    CAPTURE(isa_name(k->isa));
    for (std::size_t n : kSizes) {
      CAPTURE(n);
      const auto x = random_floats(n, 1, -2.0f, 2.0f);
      const auto y0 = random_floats(n, 2, -2.0f, 2.0f);
      const auto g = random_floats(n, 3, -0.1f, 0.1f);
      const auto v0 = random_floats(n, 4, 0.0f, 0.01f);

      unaligned out(std::vector<float>(n, 0.0f));
      std::vector<float> ref(n);
      k->relu_forward(unaligned(x).p, out.p, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = x[i] > 0 ? x[i] : 0.0f;
      CHECK(bit_equal(out.get(n), ref));

      k->relu_backward(unaligned(x).p, unaligned(g).p, out.p, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = x[i] > 0 ? g[i] : 0.0f;
      CHECK(bit_equal(out.get(n), ref));

      k->tanh_forward(unaligned(x).p, out.p, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = ew::tanh_f(x[i]);
      CHECK(bit_equal(out.get(n), ref));

      k->tanh_backward(unaligned(x).p, unaligned(g).p, out.p, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = g[i] * (1.0f - x[i] * x[i]);
      CHECK(bit_equal(out.get(n), ref));

      unaligned acc(y0);
      k->add_inplace(acc.p, unaligned(x).p, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = y0[i] + x[i];
      CHECK(bit_equal(acc.get(n), ref));

      unaligned sc(y0);
      k->scale_inplace(sc.p, 0.37f, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = y0[i] * 0.37f;
      CHECK(bit_equal(sc.get(n), ref));

      unaligned mn(y0), mx(y0);
      k->min_inplace(mn.p, unaligned(x).p, n);
      k->max_inplace(mx.p, unaligned(x).p, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = x[i] < y0[i] ? x[i] : y0[i];
      CHECK(bit_equal(mn.get(n), ref));
      for (std::size_t i = 0; i < n; ++i) ref[i] = x[i] > y0[i] ? x[i] : y0[i];
      CHECK(bit_equal(mx.get(n), ref));

      // Bytes from an odd offset, decoded through a 256-entry table.
      std::vector<uint8_t> bytes(n + 1);
      for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
      const auto table = random_floats(256, 5);
      k->decode_bytes(bytes.data() + 1, table.data(), out.p, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = table[bytes[i + 1]];
      CHECK(bit_equal(out.get(n), ref));

      unaligned f(x);
      k->fill(f.p, 2.5f, n);
      CHECK(bit_equal(f.get(n), std::vector<float>(n, 2.5f)));

      CHECK(k->reduce_min(unaligned(x).p, n) == *std::min_element(x.begin(), x.end()));
      CHECK(k->reduce_max(unaligned(x).p, n) == *std::max_element(x.begin(), x.end()));
      double s = 0;
      for (float e : x) s += e;
      CHECK(k->reduce_sum(unaligned(x).p, n) == doctest::Approx(s).epsilon(1e-12));

      // The three sources summed in order, then scaled; dst is source 0.
      unaligned s0(y0), s1(x), s2(g);
      const float* srcs[] = {s0.p, s1.p, s2.p};
      k->sum_sources(s0.p, srcs, 3, n, 0.25f);
      for (std::size_t i = 0; i < n; ++i) ref[i] = ((y0[i] + x[i]) + g[i]) * 0.25f;
      CHECK(bit_equal(s0.get(n), ref));
    }
  }
}

TEST_CASE("optimizer steps equal the scalar update rules bit for bit at every level") {
  for (const auto* k : levels()) {
    CAPTURE(isa_name(k->isa));
    for (std::size_t n : kSizes) {
      CAPTURE(n);
      const auto w0 = random_floats(n, 11);
      const auto g = random_floats(n, 12, -0.1f, 0.1f);
      const auto m0 = random_floats(n, 13, -0.01f, 0.01f);
      const auto v0 = random_floats(n, 14, 0.0f, 0.001f);
      for (bool decoupled : {false, true}) {
        unaligned w(w0), m(m0), v(v0);
        // step_size 1e-3 / 0.19, inv_sqrt_bc2 1 / sqrt(0.002): the scalars of step 2
        k->adam_step(w.p, m.p, v.p, unaligned(g).p, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.00526f, 22.36f,
                     0.01f, decoupled);
        std::vector<float> rw = w0, rm = m0, rv = v0;
        for (std::size_t i = 0; i < n; ++i)
          ew::adam_update(rw[i], rm[i], rv[i], g[i], 1e-3f, 0.9f, 0.999f, 1e-8f, 0.00526f, 22.36f,
                          0.01f, decoupled);
        CHECK(bit_equal(w.get(n), rw));
        CHECK(bit_equal(m.get(n), rm));
        CHECK(bit_equal(v.get(n), rv));
      }
      for (bool nesterov : {false, true}) {
        unaligned w(w0), m(m0);
        k->momentum_step(w.p, m.p, unaligned(g).p, n, 0.1f, 0.9f, nesterov, 1e-4f);
        std::vector<float> rw = w0, rm = m0;
        for (std::size_t i = 0; i < n; ++i)
          ew::momentum_update(rw[i], rm[i], g[i], 0.1f, 0.9f, nesterov, 1e-4f);
        CHECK(bit_equal(w.get(n), rw));
        CHECK(bit_equal(m.get(n), rm));
      }
      {
        unaligned w(w0), ms(v0);
        k->rmsprop_step(w.p, ms.p, unaligned(g).p, n, 1e-3f, 0.9f, 1e-7f, 1e-4f);
        std::vector<float> rw = w0, rms = v0;
        for (std::size_t i = 0; i < n; ++i)
          ew::rmsprop_update(rw[i], rms[i], g[i], 1e-3f, 0.9f, 1e-7f, 1e-4f);
        CHECK(bit_equal(w.get(n), rw));
        CHECK(bit_equal(ms.get(n), rms));
      }
      {
        unaligned w(w0), wd(w0);
        k->sgd_step(w.p, unaligned(g).p, n, 0.1f, 1e-4f);
        k->decoupled_decay_step(wd.p, n, 0.1f, 1e-2f);
        std::vector<float> rw = w0, rwd = w0;
        for (std::size_t i = 0; i < n; ++i) {
          ew::sgd_update(rw[i], g[i], 0.1f, 1e-4f);
          ew::decoupled_decay(rwd[i], 0.1f, 1e-2f);
        }
        CHECK(bit_equal(w.get(n), rw));
        CHECK(bit_equal(wd.get(n), rwd));
      }
    }
  }
}

TEST_CASE("the fused activation backward and bias gradient equal two plain passes") {
  const int64_t shapes[][2] = {{1, 1}, {7, 33}, {33, 7}, {3, 1000}};
  for (const auto* k : levels()) {
    CAPTURE(isa_name(k->isa));
    for (auto [rows, cols] : shapes) {
      CAPTURE(rows);
      CAPTURE(cols);
      const auto n = static_cast<std::size_t>(rows * cols);
      const auto y = random_floats(n, 21, -1.0f, 1.0f);
      const auto dy = random_floats(n, 22);
      const auto db0 = random_floats(static_cast<std::size_t>(cols), 23);
      for (auto act : {activation::none, activation::relu, activation::tanh}) {
        for (bool accumulate : {false, true}) {
          std::vector<float> rdx(n), rdb = db0;
          for (std::size_t i = 0; i < n; ++i)
            rdx[i] = act == activation::relu   ? (y[i] > 0 ? dy[i] : 0.0f)
                     : act == activation::tanh ? dy[i] * (1.0f - y[i] * y[i])
                                               : dy[i];
          if (!accumulate) std::fill(rdb.begin(), rdb.end(), 0.0f);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < cols; ++j) rdb[j] += rdx[r * cols + j];
          unaligned dx(dy), db(db0);  // in place: dx aliases dy
          k->activation_backward_bias(act, unaligned(y).p, dx.p, dx.p, db.p, rows, cols,
                                      accumulate);
          CHECK(bit_equal(dx.get(n), rdx));
          CHECK(bit_equal(db.get(static_cast<std::size_t>(cols)), rdb));
          unaligned cs(db0);
          k->column_sums(unaligned(rdx).p, cs.p, rows, cols, accumulate);
          CHECK(bit_equal(cs.get(static_cast<std::size_t>(cols)), rdb));
        }
      }
    }
  }
}

TEST_CASE("softmax-CE at every level equals the baseline's loss, gradient and hits") {
  const auto* base = vector_kernels_for(cpu_isa::baseline);
  for (const auto* k : levels()) {
    CAPTURE(isa_name(k->isa));
    for (int64_t classes : {1, 7, 33}) {
      const int64_t batch = 9;
      const auto logits = random_floats(static_cast<std::size_t>(batch * classes), 31, -4, 4);
      std::vector<int32_t> labels(batch);
      for (int64_t r = 0; r < batch; ++r) labels[r] = static_cast<int32_t>((r * 5) % classes);
      std::vector<float> d1(logits.size()), d2(logits.size());
      int64_t h1 = 0, h2 = 0;
      const double l1 = base->softmax_cross_entropy(logits.data(), labels.data(), batch, classes,
                                                    0.5f, d1.data(), &h1);
      unaligned lg(logits);
      const double l2 =
          k->softmax_cross_entropy(lg.p, labels.data(), batch, classes, 0.5f, lg.p, &h2);
      CHECK(l1 == l2);
      CHECK(h1 == h2);
      CHECK(bit_equal(d1, lg.get(logits.size())));
    }
  }
}

TEST_CASE("oneDNN products on odd shapes and unaligned pointers match double precision") {
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 33, 1}, {1, 7, 33}, {33, 7, 1000}, {5, 1000, 7}};
  for (auto [m, kk, n] : shapes) {
    CAPTURE(m);
    CAPTURE(kk);
    CAPTURE(n);
    const auto x = random_floats(static_cast<std::size_t>(m * kk), 41);
    const auto w = random_floats(static_cast<std::size_t>(kk * n), 42);
    const auto b = random_floats(static_cast<std::size_t>(n), 43);
    const auto dy = random_floats(static_cast<std::size_t>(m * n), 44);
    unaligned ux(x), uw(w), ub(b), udy(dy);
    const double tol = 1e-5 * static_cast<double>(kk > m ? kk : m) + 1e-6;
    for (auto act : {activation::none, activation::relu, activation::tanh}) {
      unaligned y(std::vector<float>(static_cast<std::size_t>(m * n)));
      dense_forward(ux.p, uw.p, ub.p, y.p, m, kk, n, act);
      auto got = y.get(static_cast<std::size_t>(m * n));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) {
          double s = b[j];
          for (int64_t q = 0; q < kk; ++q) s += double(x[r * kk + q]) * double(w[q * n + j]);
          if (act == activation::relu) s = s > 0 ? s : 0;
          if (act == activation::tanh) s = std::tanh(s);
          REQUIRE(got[r * n + j] == doctest::Approx(s).epsilon(tol).scale(1.0));
        }
    }
    for (bool accumulate : {false, true}) {
      const auto dw0 = random_floats(static_cast<std::size_t>(kk * n), 45);
      unaligned dw(dw0), dx(std::vector<float>(static_cast<std::size_t>(m * kk)));
      dense_backward(ux.p, uw.p, udy.p, dx.p, dw.p, nullptr, m, kk, n, accumulate);
      auto gw = dw.get(static_cast<std::size_t>(kk * n));
      auto gx = dx.get(static_cast<std::size_t>(m * kk));
      for (int64_t q = 0; q < kk; ++q)
        for (int64_t j = 0; j < n; ++j) {
          double s = accumulate ? dw0[q * n + j] : 0.0;
          for (int64_t r = 0; r < m; ++r) s += double(x[r * kk + q]) * double(dy[r * n + j]);
          REQUIRE(gw[q * n + j] == doctest::Approx(s).epsilon(tol).scale(1.0));
        }
      for (int64_t r = 0; r < m; ++r)
        for (int64_t q = 0; q < kk; ++q) {
          double s = 0;
          for (int64_t j = 0; j < n; ++j) s += double(dy[r * n + j]) * double(w[q * n + j]);
          REQUIRE(gx[r * kk + q] == doctest::Approx(s).epsilon(tol).scale(1.0));
        }
    }
  }
  // Each shape's product is made once per thread and reused.
  CHECK(onednn::cached_primitives() > 0);
  const auto before = onednn::cached_primitives();
  std::vector<float> x(7 * 33, 1.0f), w(33, 1.0f), y(7);
  dense_forward(x.data(), w.data(), nullptr, y.data(), 7, 33, 1);
  dense_forward(x.data(), w.data(), nullptr, y.data(), 7, 33, 1);
  CHECK(onednn::cached_primitives() <= before + 1);
  CHECK(y[3] == 33.0f);
}

TEST_CASE("a thread's products run on that thread alone: oneDNN's OpenMP team is one") {
  using get_threads_fn = int (*)();
  const auto get_threads =
      reinterpret_cast<get_threads_fn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  if (!get_threads) {
    troupe::test::skip_case("this oneDNN runs on no OpenMP runtime: nothing to limit");
    return;
  }
  int seen = -1;
  std::thread t([&] {
    std::vector<float> x(64 * 32, 1.0f), w(32 * 16, 0.5f), y(64 * 16);
    dense_forward(x.data(), w.data(), nullptr, y.data(), 64, 32, 16);
    seen = get_threads();
  });
  t.join();
  CHECK(seen == 1);
}
