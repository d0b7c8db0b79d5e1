#include "models/model.hpp"

#include <stdexcept>

#include "models/mlp.hpp"
#include "models/registry.hpp"

namespace troupe {

std::vector<named_tensor> gradients_like(const std::vector<named_tensor>& vars) {
  std::vector<named_tensor> g;
  g.reserve(vars.size());
  for (const auto& v : vars) g.push_back({v.name, tensor(v.value.shape(), v.value.type())});
  return g;
}

std::vector<named_tensor> model::make_gradients() {
  return gradients_like(variables());
}

namespace {
named_registry<model_factory>& registry() {
  static named_registry<model_factory> r{"model kind", {{"mlp", &make_mlp}}};
  return r;
}
}  // namespace

void register_model(const std::string& kind, model_factory f) {
  registry().add(kind, std::move(f));
}

std::vector<std::string> registered_models() {
  return registry().names();
}

std::unique_ptr<model> create_model(const model_config& c, const model_shape& s, uint64_t seed) {
  auto f = registry().find(c.kind);
  if (!f)
    throw std::invalid_argument("model.kind: unknown model '" + c.kind +
                                "' (registered: " + registry().known() + ")");
  return f(c, s, seed);
}

}  // namespace troupe
