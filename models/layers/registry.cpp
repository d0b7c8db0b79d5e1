// The layer types: one builder each (in the file of its layer), found by the
// spec's "type".
#include <utility>

#include "models/layers/keys.hpp"

namespace troupe::layers {

using builder = std::unique_ptr<layer> (*)(const json&, const std::string&, const shape&,
                                           const json*, build_context&);
std::unique_ptr<layer> build_dense(const json&, const std::string&, const shape&, const json*,
                                   build_context&);
std::unique_ptr<layer> build_conv2d(const json&, const std::string&, const shape&, const json*,
                                    build_context&);
std::unique_ptr<layer> build_pool2d(const json&, const std::string&, const shape&, const json*,
                                    build_context&);
std::unique_ptr<layer> build_global_avg_pool2d(const json&, const std::string&, const shape&,
                                               const json*, build_context&);
std::unique_ptr<layer> build_flatten(const json&, const std::string&, const shape&, const json*,
                                     build_context&);
std::unique_ptr<layer> build_reshape(const json&, const std::string&, const shape&, const json*,
                                     build_context&);
std::unique_ptr<layer> build_pointwise(const json&, const std::string&, const shape&, const json*,
                                       build_context&);
std::unique_ptr<layer> build_dropout(const json&, const std::string&, const shape&, const json*,
                                     build_context&);
std::unique_ptr<layer> build_batch_norm(const json&, const std::string&, const shape&, const json*,
                                        build_context&);
std::unique_ptr<layer> build_layer_norm(const json&, const std::string&, const shape&, const json*,
                                        build_context&);
std::unique_ptr<layer> build_embedding(const json&, const std::string&, const shape&, const json*,
                                       build_context&);
std::unique_ptr<layer> build_residual(const json&, const std::string&, const shape&, const json*,
                                      build_context&);

namespace {
const std::vector<std::pair<std::string, builder>>& builders() {
  static const std::vector<std::pair<std::string, builder>> b = {
      {"dense", &build_dense},
      {"conv2d", &build_conv2d},
      {"max_pool2d", &build_pool2d},
      {"avg_pool2d", &build_pool2d},
      {"global_avg_pool2d", &build_global_avg_pool2d},
      {"flatten", &build_flatten},
      {"reshape", &build_reshape},
      {"relu", &build_pointwise},
      {"leaky_relu", &build_pointwise},
      {"gelu", &build_pointwise},
      {"tanh", &build_pointwise},
      {"sigmoid", &build_pointwise},
      {"dropout", &build_dropout},
      {"batch_norm", &build_batch_norm},
      {"layer_norm", &build_layer_norm},
      {"embedding", &build_embedding},
      {"residual", &build_residual},
  };
  return b;
}
}  // namespace

std::vector<std::string> layer_types() {
  std::vector<std::string> out;
  for (const auto& [name, b] : builders()) out.push_back(name);
  return out;
}

std::unique_ptr<layer> build_layer(const json& spec, const std::string& path, const shape& in,
                                   const json* next, build_context& bc) {
  if (!spec.is_object()) json_read::expected(path, "a layer object with a \"type\"", spec);
  auto t = spec.find("type");
  if (t == spec.end()) json_read::fail(json_read::join(path, "type"), "missing: the layer's type");
  const auto type = json_read::read_enum(*t, json_read::join(path, "type"), layer_types());
  for (const auto& [name, build] : builders())
    if (name == type) {
      auto l = build(spec, path, in, next, bc);
      ++bc.layers_built;
      if (numel(l->output()) > (int64_t{1} << 28))
        json_read::fail(path, type + ": an output of " + describe(l->output()) +
                                  " is more than 2^28 values per example");
      return l;
    }
  json_read::fail(path, "unknown layer type");  // read_enum refused it already
}

}  // namespace troupe::layers
