#include "models/mlp.hpp"

#include <stdexcept>

#include "models/layer_model.hpp"

namespace troupe {
namespace {

// The MLP as a layer model: dense layers, each hidden one followed by the
// activation (fused into it), all initialised alike.
model_config as_layers(const model_config& c, const model_shape& s) {
  if (c.activation != "relu" && c.activation != "tanh")
    throw std::invalid_argument("model.activation: expected \"relu\" or \"tanh\", got \"" +
                                c.activation + "\"");
  if (c.init != "auto" && c.init != "he" && c.init != "glorot")
    throw std::invalid_argument("model.init: expected \"auto\", \"he\" or \"glorot\", got \"" +
                                c.init + "\"");
  if (s.features <= 0 || s.classes <= 0)
    throw std::invalid_argument("mlp: features and classes must be positive");
  const std::string init = c.init == "auto" ? (c.activation == "tanh" ? "glorot" : "he") : c.init;
  model_config out = c;
  out.kind = "layers";
  out.loss = "softmax_cross_entropy";
  out.layers = nlohmann::json::array();
  for (auto h : c.hidden) {
    out.layers.push_back({{"type", "dense"}, {"units", h}, {"init", init}});
    out.layers.push_back({{"type", c.activation}});
  }
  out.layers.push_back({{"type", "dense"}, {"units", s.classes}, {"init", init}});
  return out;
}

model_shape flat(const model_shape& s) {
  model_shape f = s;
  f.input.clear();
  f.targets = 0;
  return f;
}

}  // namespace

std::unique_ptr<model> make_mlp(const model_config& c, const model_shape& s, uint64_t seed) {
  return make_layer_model(as_layers(c, s), flat(s), seed);
}

std::unique_ptr<model> make_mlp_on(const model_config& c, const model_shape& s, uint64_t seed,
                                   std::shared_ptr<device_context> ctx) {
  return make_layer_model_on(as_layers(c, s), flat(s), seed, std::move(ctx));
}

}  // namespace troupe
