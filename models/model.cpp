#include "models/model.hpp"

#include <map>
#include <mutex>
#include <stdexcept>

#include "models/mlp.hpp"

namespace troupe {

std::vector<named_tensor> model::make_gradients() {
  std::vector<named_tensor> g;
  for (auto& v : variables()) g.push_back({v.name, tensor(v.value.shape(), v.value.type())});
  return g;
}

namespace {
std::mutex registry_mtx;
std::map<std::string, model_factory>& registry() {
  static std::map<std::string, model_factory> r{{"mlp", &make_mlp}};
  return r;
}
}  // namespace

void register_model(const std::string& kind, model_factory f) {
  std::lock_guard<std::mutex> g(registry_mtx);
  if (!registry().emplace(kind, std::move(f)).second)
    throw std::invalid_argument("model kind '" + kind + "' is already registered");
}

std::vector<std::string> registered_models() {
  std::lock_guard<std::mutex> g(registry_mtx);
  std::vector<std::string> r;
  for (auto& [k, _] : registry()) r.push_back(k);
  return r;
}

std::unique_ptr<model> create_model(const model_config& c, const model_shape& s, uint64_t seed) {
  model_factory f;
  {
    std::lock_guard<std::mutex> g(registry_mtx);
    auto i = registry().find(c.kind);
    if (i != registry().end()) f = i->second;
  }
  if (!f) {
    std::string known;
    for (auto& k : registered_models()) known += (known.empty() ? "" : ", ") + k;
    throw std::invalid_argument("model.kind: unknown model '" + c.kind + "' (registered: " + known +
                                ")");
  }
  return f(c, s, seed);
}

}  // namespace troupe
