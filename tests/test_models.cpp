#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cpu_kernels.hpp"
#include "models/model.hpp"
#include "models/random.hpp"

using namespace troupe;

namespace {
struct tiny_batch {
  tensor x, y;
  tiny_batch(int64_t b, int64_t f, uint64_t seed) : x({b, f}), y({b}, dtype::i32) {
    splitmix64 g(seed);
    for (auto& v : x.span<float>()) v = static_cast<float>(g.normal());
    for (auto& v : y.span<int32_t>()) v = static_cast<int32_t>(g.next() % 3);
  }
};
model_config cfg(const std::string& act) {
  model_config c;
  c.hidden = {5, 4};
  c.activation = act;
  return c;
}
}  // namespace

TEST_CASE("mlp: variables, seeded init, He statistics") {
  auto m = create_model(cfg("relu"), {6, 3}, 11);
  auto& v = m->variables();
  REQUIRE(v.size() == 6);
  CHECK(v[0].name == "dense_0/kernel");
  CHECK(v[0].value.shape() == shape_t{6, 5});
  CHECK(v[5].name == "dense_2/bias");
  CHECK(v[5].value.shape() == shape_t{3});
  auto m2 = create_model(cfg("relu"), {6, 3}, 11);
  auto m3 = create_model(cfg("relu"), {6, 3}, 12);
  CHECK(m2->variables()[0].value == v[0].value);
  CHECK_FALSE(m3->variables()[0].value == v[0].value);
  for (float b : v[1].value.span<float>()) CHECK(b == 0.0f);

  model_config big;
  big.hidden = {512};
  auto mb = create_model(big, {400, 10}, 1);
  auto k = mb->variables()[0].value.span<float>();
  double sum = 0, sq = 0;
  for (float x : k) sum += x, sq += double(x) * x;
  double mean = sum / k.size(), var = sq / k.size() - mean * mean;
  CHECK(std::abs(mean) < 0.002);
  CHECK(var == doctest::Approx(2.0 / 400).epsilon(0.03));  // He: var = 2/fan_in
}

TEST_CASE("mlp: gradients match numerical differentiation (relu and tanh)") {
  for (std::string act : {"relu", "tanh"}) {
    CAPTURE(act);
    auto m = create_model(cfg(act), {6, 3}, 5);
    tiny_batch b(7, 6, 9);
    auto grads = m->make_gradients();
    const float scale = 1.0f / 7;
    m->train_batch(b.x, b.y, scale, grads);
    auto loss = [&] { return m->evaluate(b.x, b.y).loss_sum / 7; };
    auto& vars = m->variables();
    for (std::size_t i = 0; i < vars.size(); ++i) {
      float* w = vars[i].value.f32();
      for (int64_t j = 0; j < vars[i].value.numel(); j += 3) {
        float saved = w[j];
        const float h = 1e-2f;
        w[j] = saved + h;
        double lp = loss();
        w[j] = saved - h;
        double lm = loss();
        w[j] = saved;
        double num = (lp - lm) / (2 * h);
        CAPTURE(vars[i].name);
        CAPTURE(j);
        CHECK(grads[i].value.f32()[j] == doctest::Approx(num).epsilon(0.02).scale(1e-2));
      }
    }
  }
}

TEST_CASE("mlp: an empty batch gives zero gradients; bad shapes throw") {
  auto m = create_model(cfg("relu"), {6, 3}, 5);
  auto grads = m->make_gradients();
  for (auto& g : grads) g.value.fill(1.0f);
  auto st = m->train_batch(tensor({0, 6}), tensor({0}, dtype::i32), 1.0f, grads);
  CHECK(st.count == 0);
  CHECK(st.loss_sum == 0);
  for (auto& g : grads)
    for (float v : g.value.span<float>()) CHECK(v == 0.0f);
  CHECK_THROWS_AS(m->train_batch(tensor({2, 5}), tensor({2}, dtype::i32), 1.0f, grads),
                  std::invalid_argument);
}

TEST_CASE("model registry: unknown kinds are named, users can add models") {
  model_config c;
  c.kind = "resnet";
  CHECK_THROWS_WITH(create_model(c, {4, 2}, 1), doctest::Contains("unknown model 'resnet'"));
  register_model("mlp_alias", [](const model_config& mc, const model_shape& s, uint64_t seed) {
    auto copy = mc;
    copy.kind = "mlp";
    return create_model(copy, s, seed);
  });
  c.kind = "mlp_alias";
  CHECK(create_model(c, {4, 2}, 1)->variables().size() == 6);
  CHECK_THROWS(register_model("mlp", nullptr));
}

TEST_CASE("mlp: accumulated micro-batch gradients equal the whole batch's") {
  auto m = create_model(cfg("tanh"), {6, 3}, 5);
  tiny_batch whole(8, 6, 3);
  tensor xa({5, 6}), ya({5}, dtype::i32), xb({3, 6}), yb({3}, dtype::i32);
  std::copy(whole.x.f32(), whole.x.f32() + 30, xa.f32());
  std::copy(whole.x.f32() + 30, whole.x.f32() + 48, xb.f32());
  std::copy(whole.y.data<int32_t>(), whole.y.data<int32_t>() + 5, ya.data<int32_t>());
  std::copy(whole.y.data<int32_t>() + 5, whole.y.data<int32_t>() + 8, yb.data<int32_t>());
  auto g_whole = m->make_gradients();
  auto g_acc = m->make_gradients();
  m->train_batch(whole.x, whole.y, 1.0f / 8, g_whole);
  m->train_batch(xa, ya, 1.0f / 8, g_acc);
  m->train_batch(tensor({0, 6}), tensor({0}, dtype::i32), 1.0f / 8, g_acc, true);  // no-op
  m->train_batch(xb, yb, 1.0f / 8, g_acc, true);
  for (std::size_t i = 0; i < g_whole.size(); ++i)
    for (int64_t j = 0; j < g_whole[i].value.numel(); ++j)
      CHECK(g_acc[i].value.f32()[j] == doctest::Approx(g_whole[i].value.f32()[j]).epsilon(1e-5));
}

TEST_CASE(
    "model size: parameters counted without overflow, absurd models refused before allocating") {
  model_config c;
  c.hidden = {256, 256};
  CHECK(dense_parameter_count(c, 784, 10) == 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);
  c.hidden = {int64_t{1} << 40, int64_t{1} << 40};
  CHECK(dense_parameter_count(c, 784, 10) == -1);  // 2^80 weights: does not fit
  CHECK_THROWS_WITH_AS(create_model(c, {784, 10}, 1),
                       doctest::Contains("has more than 2^63 parameters; at most 268435456"),
                       std::invalid_argument);
  c.hidden = {16384, 16384};  // 268M parameters: one too many layers of this width
  CHECK_THROWS_WITH_AS(create_model(c, {784, 10}, 1),
                       doctest::Contains("model.hidden: a 784-16384-16384-10"),
                       std::invalid_argument);
  c.hidden = {1024};
  CHECK(create_model(c, {784, 10}, 1) != nullptr);
}

TEST_CASE("mlp: reports each layer's gradients as soon as they are final, top layer first") {
  for (std::string act : {"relu", "tanh"}) {
    CAPTURE(act);
    auto m = create_model(cfg(act), {6, 3}, 5);
    tiny_batch b(7, 6, 9);
    auto grads = m->make_gradients();
    // What each range held when reported: it must not change afterwards.
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    std::vector<std::vector<tensor>> seen;
    m->set_gradients_ready([&](std::size_t first, std::size_t last) {
      ranges.emplace_back(first, last);
      std::vector<tensor> copy;
      for (std::size_t i = first; i < last; ++i) copy.push_back(grads[i].value.clone());
      seen.push_back(std::move(copy));
    });
    m->train_batch(b.x, b.y, 1.0f / 7, grads);
    const std::vector<std::pair<std::size_t, std::size_t>> want{{4, 6}, {2, 4}, {0, 2}};
    CHECK(ranges == want);
    for (std::size_t k = 0; k < ranges.size(); ++k)
      for (std::size_t i = ranges[k].first; i < ranges[k].second; ++i)
        CHECK(seen[k][i - ranges[k].first] == grads[i].value);
    // Cleared: no call without a hook.
    m->set_gradients_ready({});
    m->train_batch(b.x, b.y, 1.0f / 7, grads);
    CHECK(ranges.size() == 3);
  }
}
