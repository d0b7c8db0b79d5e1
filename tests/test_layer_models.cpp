// model.kind "layers": building from JSON (errors with their JSON paths),
// the MLP as a stack of dense layers, every layer's gradients through the
// whole model against finite differences, sim:N against the CPU, and what
// must not depend on how a batch is split (dropout masks, synchronised
// batch norm).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "collectives/process_group.hpp"
#include "config/job_config.hpp"
#include "devices/device_context.hpp"
#include "models/layer_model.hpp"
#include "models/model.hpp"
#include "models/random.hpp"
#include "tests/fuzz/mutate.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

model_config layers_config(json layers, std::string loss = "softmax_cross_entropy") {
  model_config c;
  c.kind = "layers";
  c.layers = std::move(layers);
  c.loss = std::move(loss);
  return c;
}

bool same(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && a.type() == b.type() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct batch_of {
  tensor x, y;
};

batch_of random_batch(int64_t b, int64_t f, int64_t classes, uint64_t seed) {
  batch_of out{tensor({b, f}), tensor({b}, dtype::i32)};
  splitmix64 g(seed);
  for (auto& v : out.x.span<float>()) v = static_cast<float>(g.normal());
  for (auto& v : out.y.span<int32_t>()) v = static_cast<int32_t>(g.next() % classes);
  return out;
}

std::string build_error(const json& layers, model_shape s,
                        std::string loss = "softmax_cross_entropy") {
  try {
    check_layer_model(layers_config(layers, loss), s);
  } catch (const config_error& e) {
    return e.what();
  }
  return "(no error)";
}

// A convnet touching every layer type with variables or a shape of its own.
json every_layer() {
  return json::parse(R"([
    {"type": "conv2d", "filters": 4, "kernel": [3, 2], "padding": "same"},
    {"type": "batch_norm"}, {"type": "relu"},
    {"type": "max_pool2d", "size": 2},
    {"type": "residual", "layers": [
      {"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1, "groups": 2},
      {"type": "gelu"}]},
    {"type": "conv2d", "filters": 6, "kernel": 2, "stride": 1, "dilation": 2, "padding": "valid"},
    {"type": "leaky_relu", "alpha": 0.1},
    {"type": "avg_pool2d", "size": 2, "stride": 1, "padding": "same"},
    {"type": "flatten"},
    {"type": "layer_norm"},
    {"type": "dense", "units": 7}, {"type": "tanh"},
    {"type": "dense", "units": 5}, {"type": "sigmoid"},
    {"type": "dense", "units": 3}])");
}

}  // namespace

TEST_CASE("layers: wrong configs are refused with the layer's JSON path") {
  model_shape img(784, 10, {1, 28, 28});
  model_shape flat(784, 10);
  CHECK(build_error(json::parse(R"([{"type": "conv2d", "filters": 8, "kernel": 3}])"), flat) ==
        "model.layers[0]: conv2d needs a [C,H,W] input, got [784]");
  CHECK(build_error(json::parse(R"([{"type": "flatten"}, {"type": "dense", "units": 10},
                                    {"type": "relu"}, {"type": "max_pool2d"}])"),
                    img) == "model.layers[3]: max_pool2d needs a [C,H,W] input, got [10]");
  CHECK(build_error(json::parse(R"([{"type": "conv3d"}])"), img)
            .starts_with("model.layers[0].type: expected one of \"dense\""));
  CHECK(build_error(json::parse(R"([{"type": "conv2d", "filters": 8, "kernal": 3}])"), img)
            .find("model.layers[0]") == 0);
  CHECK(build_error(json::parse(R"([{"type": "conv2d", "filters": 8}])"), img) ==
        "model.layers[0].kernel: missing: the kernel size, an integer or [h, w]");
  CHECK(build_error(json::parse(R"([{"type": "conv2d", "filters": -1, "kernel": 3}])"), img)
            .starts_with("model.layers[0].filters: expected an integer"));
  CHECK(build_error(json::parse(R"([{"type": "conv2d", "filters": 3, "kernel": 3, "groups": 2}])"),
                    img)
            .starts_with("model.layers[0].groups: groups 2 must divide"));
  CHECK(build_error(json::parse(R"([{"type": "conv2d", "filters": 3, "kernel": 40}])"), img) ==
        "model.layers[0]: conv2d: a 40x40 window does not fit the padded [1,28,28] input");
  CHECK(build_error(json::parse(R"([{"type": "dropout", "rate": 1.0}])"), img)
            .starts_with("model.layers[0].rate: expected a number in [0, 1)"));
  CHECK(build_error(json::parse(R"([{"type": "residual", "layers": [
                                      {"type": "conv2d", "filters": 2, "kernel": 1}]}])"),
                    img) ==
        "model.layers[0]: residual: its layers turn [1,28,28] into [2,28,28]; they must keep "
        "the shape");
  CHECK(build_error(json::parse(R"([{"type": "residual", "layers": [
                                      {"type": "dense", "units": 2}]}])"),
                    img) ==
        "model.layers[0].layers[0]: dense needs a [features] (flatten first) input, got "
        "[1,28,28]");
  CHECK(build_error(json::parse(R"([{"type": "reshape", "shape": [3, -1]}])"), img) ==
        "model.layers[0].shape: reshape cannot turn [1,28,28] (784 values) into [3,-1]");
  CHECK(build_error(json::parse(R"([{"type": "flatten"}, {"type": "dense", "units": 9}])"), img) ==
        "model.layers: the last layer gives [9] but the loss (softmax_cross_entropy) needs [10]: "
        "one logit per class");
  CHECK(build_error(json::parse(R"([{"type": "flatten"}, {"type": "embedding", "vocab": 5,
                                     "dim": 2}])"),
                    img) ==
        "model.layers[1]: embedding must be the first layer: it reads the data's integer ids");
  CHECK(build_error(json::parse(R"([{"type": "flatten"}, {"type": "dense", "units": 65536},
                                    {"type": "dense", "units": 65536}])"),
                    img) == "model.layers[2]: the model would have more than 2^28 parameters");
  // Fine ones build, with every variable named and shaped.
  CHECK(build_error(every_layer(), model_shape(5 * 7 * 9, 3, {5, 7, 9})) == "(no error)");
}

TEST_CASE("layers: variables are named per type, shaped, seeded; buffers hold running stats") {
  auto m = create_model(layers_config(every_layer()), model_shape(5 * 7 * 9, 3, {5, 7, 9}), 4);
  std::vector<std::string> names;
  for (auto& v : m->variables()) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{
                     "conv2d_0/kernel", "conv2d_0/bias", "batch_norm_0/gamma", "batch_norm_0/beta",
                     "conv2d_1/kernel", "conv2d_1/bias", "conv2d_2/kernel", "conv2d_2/bias",
                     "layer_norm_0/gamma", "layer_norm_0/beta", "dense_0/kernel", "dense_0/bias",
                     "dense_1/kernel", "dense_1/bias", "dense_2/kernel", "dense_2/bias"});
  CHECK(m->variables()[0].value.shape() == shape_t{4, 5, 3, 2});
  CHECK(m->variables()[4].value.shape() == shape_t{4, 2, 3, 3});  // groups 2
  REQUIRE(m->buffers().size() == 2);
  CHECK(m->buffers()[0].name == "batch_norm_0/moving_mean");
  CHECK(m->buffers()[1].value.f32()[0] == 1.0f);
  auto again = create_model(layers_config(every_layer()), model_shape(315, 3, {5, 7, 9}), 4);
  auto other = create_model(layers_config(every_layer()), model_shape(315, 3, {5, 7, 9}), 5);
  CHECK(again->variables()[0].value.f32()[3] == m->variables()[0].value.f32()[3]);
  CHECK(other->variables()[0].value.f32()[3] != m->variables()[0].value.f32()[3]);
}

TEST_CASE("layers: the mlp kind is a stack of dense layers with the same variables and results") {
  model_config mlp;
  mlp.hidden = {6, 5};
  for (std::string act : {"relu", "tanh"}) {
    CAPTURE(act);
    mlp.activation = act;
    auto a = create_model(mlp, {7, 3}, 21);
    std::string init = act == "relu" ? "he" : "glorot";
    auto b = create_model(layers_config(json::array({
                              {{"type", "dense"}, {"units", 6}, {"init", init}},
                              {{"type", act}},
                              {{"type", "dense"}, {"units", 5}, {"init", init}},
                              {{"type", act}},
                              {{"type", "dense"}, {"units", 3}, {"init", init}},
                          })),
                          {7, 3}, 21);
    REQUIRE(a->variables().size() == b->variables().size());
    for (std::size_t i = 0; i < a->variables().size(); ++i) {
      CHECK(a->variables()[i].name == b->variables()[i].name);
      CHECK(same(a->variables()[i].value, b->variables()[i].value));
    }
    auto batch = random_batch(9, 7, 3, 2);
    auto ga = a->make_gradients(), gb = b->make_gradients();
    auto sa = a->train_batch(batch.x, batch.y, 1.0f / 9, ga);
    auto sb = b->train_batch(batch.x, batch.y, 1.0f / 9, gb);
    CHECK(sa.loss_sum == sb.loss_sum);
    for (std::size_t i = 0; i < ga.size(); ++i) CHECK(same(ga[i].value, gb[i].value));
  }
}

namespace {

// Rows [first, first + n) of a batch, and their ids.
batch_of rows(const batch_of& b, int64_t first, int64_t n) {
  const int64_t f = b.x.dim(1);
  batch_of out{tensor({n, f}), tensor({n}, dtype::i32)};
  std::copy(b.x.f32() + first * f, b.x.f32() + (first + n) * f, out.x.f32());
  std::copy(b.y.data<int32_t>() + first, b.y.data<int32_t>() + first + n, out.y.data<int32_t>());
  return out;
}
tensor ids(int64_t first, int64_t n) {
  tensor t({n}, dtype::i64);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = 1000 + first + i;
  return t;
}

double loss_of(model& m, const batch_of& b, const tensor& id) {
  auto g = m.make_gradients();
  m.set_step(3, &id);
  return m.train_batch(b.x, b.y, 1.0f, g).loss_sum;
}

json with_dropout() {
  auto l = every_layer();
  l.insert(l.begin() + 9, json{{"type", "dropout"}, {"rate", 0.3}});
  return l;
}

}  // namespace

TEST_CASE("layers: every layer's gradients, through the whole model, match finite differences") {
  model_shape s(5 * 7 * 9, 3, {5, 7, 9});
  auto m = create_model(layers_config(with_dropout()), s, 8);
  auto b = random_batch(4, s.features, 3, 6);
  auto id = ids(0, 4);
  auto grads = m->make_gradients();
  m->set_step(3, &id);
  m->train_batch(b.x, b.y, 1.0f, grads);
  splitmix64 pick(5);
  for (std::size_t v = 0; v < m->variables().size(); ++v) {
    auto& var = m->variables()[v];
    CAPTURE(var.name);
    for (int k = 0; k < 3; ++k) {
      const auto j = static_cast<int64_t>(pick.next() % static_cast<uint64_t>(var.value.numel()));
      float* p = var.value.f32() + j;
      const float keep = *p;
      const float h = 1e-2f * std::max(1.0f, std::fabs(keep));
      *p = keep + h;
      double up = loss_of(*m, b, id);
      *p = keep - h;
      double down = loss_of(*m, b, id);
      *p = keep;
      double numeric = (up - down) / (2.0 * h);
      CHECK(grads[v].value.f32()[j] == doctest::Approx(numeric).epsilon(3e-2).scale(1e-2));
    }
  }
}

TEST_CASE("layers: global_avg_pool2d is each channel's mean, with gradients to match") {
  // Alone, its outputs are the logits: the loss is softmax cross-entropy
  // of each channel's mean, computed here in double.
  const int64_t c = 3, h = 5, w = 4;
  model_shape s(c * h * w, c, {c, h, w});
  auto pool = create_model(layers_config(json::parse(R"([{"type": "global_avg_pool2d"}])")), s, 1);
  auto b = random_batch(4, s.features, c, 11);
  auto id = ids(0, 4);
  double want = 0;
  for (int64_t r = 0; r < 4; ++r) {
    std::vector<double> mean(c, 0.0);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < h * w; ++i) mean[ch] += b.x.f32()[r * c * h * w + ch * h * w + i];
    double norm = 0;
    for (auto& m : mean) norm += std::exp(m /= static_cast<double>(h * w));
    want -= mean[b.y.data<int32_t>()[r]] - std::log(norm);
  }
  CHECK(loss_of(*pool, b, id) == doctest::Approx(want).epsilon(1e-5));

  // Between a convolution and a dense layer: the convolution's gradients
  // come back through the pooling's backward.
  auto m = create_model(layers_config(json::parse(R"([
    {"type": "conv2d", "filters": 2, "kernel": 2, "padding": "same"},
    {"type": "global_avg_pool2d"}, {"type": "dense", "units": 3}])")),
                        s, 2);
  auto grads = m->make_gradients();
  m->set_step(3, &id);
  m->train_batch(b.x, b.y, 1.0f, grads);
  for (std::size_t v = 0; v < m->variables().size(); ++v) {
    auto& var = m->variables()[v];
    CAPTURE(var.name);
    for (int64_t j = 0; j < var.value.numel(); ++j) {
      float* p = var.value.f32() + j;
      const float keep = *p;
      const float step = 1e-2f * std::max(1.0f, std::fabs(keep));
      *p = keep + step;
      const double up = loss_of(*m, b, id);
      *p = keep - step;
      const double down = loss_of(*m, b, id);
      *p = keep;
      CHECK(grads[v].value.f32()[j] ==
            doctest::Approx((up - down) / (2.0 * step)).epsilon(3e-2).scale(1e-2));
    }
  }
}

TEST_CASE("layers: relu then max pooling runs pooled first, with the same results bit for bit") {
  // The stack runs [relu, max_pool2d] as [max_pool2d, relu]; a reshape in
  // between keeps the order as written. Inputs on a coarse grid make ties,
  // windows of zeros and windows of negatives only.
  model_shape s(2 * 6 * 6, 3, {2, 6, 6});
  auto net = [](bool as_written) {
    auto l = json::array({{{"type", "conv2d"}, {"filters", 2}, {"kernel", 1}}, {{"type", "relu"}}});
    if (as_written) l.push_back({{"type", "reshape"}, {"shape", {2, 6, 6}}});
    l.push_back({{"type", "max_pool2d"}, {"size", 2}});
    l.push_back({{"type", "flatten"}});
    l.push_back({{"type", "dense"}, {"units", 3}});
    return l;
  };
  auto pooled_first = create_model(layers_config(net(false)), s, 4);
  auto written = create_model(layers_config(net(true)), s, 4);
  REQUIRE(pooled_first->variables().size() == written->variables().size());
  for (auto* m : {pooled_first.get(), written.get()}) {  // the 1x1 conv passes x through
    auto& w = m->variables()[0].value;
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = (i % 3 == 0) ? 1.0f : 0.0f;
  }
  for (std::size_t v = 0; v < written->variables().size(); ++v)
    REQUIRE(same(pooled_first->variables()[v].value, written->variables()[v].value));
  auto b = random_batch(8, s.features, 3, 12);
  for (auto& x : b.x.span<float>()) x = std::round(x * 2.0f) / 2.0f;  // -1, -0.5, 0, 0.5, ...
  b.x.f32()[0] = -0.0f;
  auto ga = pooled_first->make_gradients(), gb = written->make_gradients();
  auto sa = pooled_first->train_batch(b.x, b.y, 1.0f / 8, ga);
  auto sb = written->train_batch(b.x, b.y, 1.0f / 8, gb);
  CHECK(sa.loss_sum == sb.loss_sum);
  for (std::size_t i = 0; i < ga.size(); ++i) {
    CAPTURE(ga[i].name);
    CHECK(same(ga[i].value, gb[i].value));
  }
  bool some_grad = false;  // the conv's weights see where the gradients went
  for (float g : ga[0].value.span<float>()) some_grad = some_grad || g != 0.0f;
  CHECK(some_grad);
  auto ea = pooled_first->evaluate(b.x, b.y), eb = written->evaluate(b.x, b.y);
  CHECK(ea.loss_sum == eb.loss_sum);
}

TEST_CASE("layers: sim:N computes what the CPU computes, variables and buffers staged") {
  model_shape s(5 * 7 * 9, 3, {5, 7, 9});
  auto cpu = create_model(layers_config(with_dropout()), s, 8);
  auto sim = create_model_on(layers_config(with_dropout()), s, 8,
                             make_device_context(parse_device("sim:1")));
  REQUIRE(sim->device_resident());
  auto b = random_batch(6, s.features, 3, 7);
  auto id = ids(0, 6);
  auto gc = cpu->make_gradients(), gs = sim->make_gradients();
  cpu->set_step(2, &id);
  sim->set_step(2, &id);
  auto sc = cpu->train_batch(b.x, b.y, 1.0f / 6, gc);
  auto ss = sim->train_batch(b.x, b.y, 1.0f / 6, gs);
  sim->gradients_to_host(gs);
  CHECK(sc.loss_sum == ss.loss_sum);
  CHECK(sc.correct == ss.correct);
  for (std::size_t i = 0; i < gc.size(); ++i) CHECK(same(gc[i].value, gs[i].value));
  sim->variables_to_host();
  for (std::size_t i = 0; i < cpu->buffers().size(); ++i)
    CHECK(same(cpu->buffers()[i].value, sim->buffers()[i].value));  // running statistics
  auto ec = cpu->evaluate(b.x, b.y), es = sim->evaluate(b.x, b.y);
  CHECK(ec.loss_sum == es.loss_sum);
}

TEST_CASE("layers: two replicas with half a batch each and synced batch norm = one device") {
  model_shape s(5 * 7 * 9, 3, {5, 7, 9});
  auto cfg = layers_config(with_dropout());
  auto one = create_model(cfg, s, 8);
  CHECK(one->synced_statistics());
  auto b = random_batch(8, s.features, 3, 9);
  auto all_ids = ids(0, 8);
  auto g_one = one->make_gradients();
  one->set_step(5, &all_ids);
  auto st_one = one->train_batch(b.x, b.y, 1.0f / 8, g_one);

  // Unequal slices (5 + 3): the count travels with the sums.
  const int64_t first[2] = {0, 5}, count[2] = {5, 3};
  auto group = make_device_rendezvous(2, parse_device("cpu:0"));
  std::vector<std::unique_ptr<model>> reps;
  std::vector<std::vector<named_tensor>> grads(2);
  std::vector<batch_stats> st(2);
  for (int r = 0; r < 2; ++r) reps.push_back(create_model(cfg, s, 8));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto ctx = make_device_context(parse_device("cpu:" + std::to_string(r)));
      auto comm = group->join(r, *ctx);
      reps[r]->set_statistics_group(comm.get());
      auto part = rows(b, first[r], count[r]);
      auto id = ids(first[r], count[r]);
      grads[r] = reps[r]->make_gradients();
      reps[r]->set_step(5, &id);
      st[r] = reps[r]->train_batch(part.x, part.y, 1.0f / 8, grads[r]);
      reps[r]->set_statistics_group(nullptr);
    });
  for (auto& t : threads) t.join();
  CHECK(st[0].loss_sum + st[1].loss_sum == doctest::Approx(st_one.loss_sum).epsilon(1e-5));
  for (std::size_t i = 0; i < g_one.size(); ++i) {
    CAPTURE(g_one[i].name);
    // (A bias before batch norm has a zero gradient: rounding noise.)
    for (int64_t j = 0; j < g_one[i].value.numel(); ++j) {
      const double two = double(grads[0][i].value.f32()[j]) + grads[1][i].value.f32()[j];
      const double ref = g_one[i].value.f32()[j];
      CHECK(std::abs(two - ref) <= 1e-4 * std::abs(ref) + 1e-7);
    }
  }
  // The running statistics moved the same way on every replica.
  for (std::size_t i = 0; i < one->buffers().size(); ++i)
    for (int64_t j = 0; j < one->buffers()[i].value.numel(); ++j)
      CHECK(reps[1]->buffers()[i].value.f32()[j] ==
            doctest::Approx(one->buffers()[i].value.f32()[j]).epsilon(1e-5));
}

TEST_CASE("layers: a replica with no rows still joins the synced statistics") {
  model_shape s(5 * 7 * 9, 3, {5, 7, 9});
  auto cfg = layers_config(every_layer());
  auto group = make_device_rendezvous(2, parse_device("cpu:0"));
  auto b = random_batch(3, s.features, 3, 4);
  std::vector<std::unique_ptr<model>> reps;
  for (int r = 0; r < 2; ++r) reps.push_back(create_model(cfg, s, 8));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto ctx = make_device_context(parse_device("cpu:" + std::to_string(r)));
      auto comm = group->join(r, *ctx);
      reps[r]->set_statistics_group(comm.get());
      auto part = rows(b, 0, r == 0 ? 3 : 0);
      auto g = reps[r]->make_gradients();
      reps[r]->train_batch(part.x, part.y, 1.0f / 3, g);
      reps[r]->set_statistics_group(nullptr);
    });
  for (auto& t : threads) t.join();  // a hang here is the failure
  CHECK(same(reps[0]->buffers()[0].value, reps[1]->buffers()[0].value));
}

TEST_CASE("layers: regression and binary losses, float targets") {
  model_shape s(4, 0, {}, 2);
  auto mse =
      create_model(layers_config(json::parse(R"([{"type": "dense", "units": 2}])"), "mse"), s, 1);
  tensor x({3, 4}), y({3, 2});
  for (int i = 0; i < 12; ++i) x.f32()[i] = 0.1f * static_cast<float>(i);
  for (int i = 0; i < 6; ++i) y.f32()[i] = static_cast<float>(i % 2);
  auto g = mse->make_gradients();
  auto st = mse->train_batch(x, y, 1.0f / 3, g);
  // The loss is what the kernel's definition gives from the model's outputs.
  auto& w = mse->variables()[0].value;
  double want = 0;
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 2; ++k) {
      double p = 0;
      for (int i = 0; i < 4; ++i) p += x.f32()[r * 4 + i] * w.f32()[i * 2 + k];
      want += (p - y.f32()[r * 2 + k]) * (p - y.f32()[r * 2 + k]) / 2;
    }
  CHECK(st.loss_sum == doctest::Approx(want).epsilon(1e-5));
  CHECK_THROWS_AS(mse->train_batch(x, tensor({3}, dtype::i32), 1.0f, g), std::invalid_argument);
  auto bce = create_model(
      layers_config(json::parse(R"([{"type": "dense", "units": 2}])"), "binary_cross_entropy"), s,
      1);
  auto gb = bce->make_gradients();
  auto sb = bce->train_batch(x, y, 1.0f / 3, gb);
  CHECK(sb.loss_sum > 0);
  CHECK(sb.correct >= 0);
  CHECK(sb.correct <= 3);
}

TEST_CASE("layers: embedding ids are checked on the host; a bag of ids averages") {
  model_shape s(3, 2, {3});
  auto m = create_model(
      layers_config(json::parse(R"([{"type": "embedding", "vocab": 5, "dim": 4, "pool": "mean"},
                                    {"type": "dense", "units": 2}])")),
      s, 3);
  tensor x = tensor::from<float>({2, 3}, {0, 1, 4, 2, 2, 3});
  tensor y = tensor::from<int32_t>({2}, {0, 1});
  auto g = m->make_gradients();
  CHECK_NOTHROW(m->train_batch(x, y, 0.5f, g));
  // Only ids the batch names get a gradient: id 0's row is updated, id... all
  // appear except none; so check row sums by hand for a batch without id 1.
  x.f32()[1] = 7;
  CHECK_THROWS_WITH_AS(
      m->train_batch(x, y, 0.5f, g),
      doctest::Contains("embedding: id 7.000000 at row 0 is not an integer in [0, 5)"),
      std::out_of_range);
  x.f32()[1] = 0.5f;
  CHECK_THROWS_AS(m->train_batch(x, y, 0.5f, g), std::out_of_range);
}

TEST_CASE("layers: mutated layer specs are built or refused with a config_error, nothing else") {
  fuzz::mutator mutate(7);
  const std::string valid = every_layer().dump();
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string m = mutate(valid);
    json layers = json::parse(m, nullptr, false);
    if (layers.is_discarded()) continue;
    for (const auto& s : {model_shape(5 * 7 * 9, 3, {5, 7, 9}), model_shape(784, 10)}) {
      try {
        check_layer_model(layers_config(layers), s);
        ++accepted;
      } catch (const config_error&) {
      }
    }
  }
  MESSAGE(accepted << " mutants built");
  CHECK(accepted > 0);
}
