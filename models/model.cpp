#include "models/model.hpp"

#include <map>
#include <sstream>
#include <stdexcept>

#include "config/registry.hpp"
#include "devices/device_context.hpp"
#include "kernels/optimizer.hpp"
#include "models/layer_model.hpp"
#include "models/mlp.hpp"

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
  static named_registry<model_factory> r{"model kind",
                                         {{"mlp", &make_mlp}, {"layers", &make_layer_model}}};
  return r;
}

// A job config may name the built-in kinds from the start (register_model
// adds the others).
[[maybe_unused]] const bool builtin_kinds_known = [] {
  for (const auto& kind : registry().names()) register_model_kind(kind, model_family::classifier);
  return true;
}();
}  // namespace

void register_model(const std::string& kind, model_factory f) {
  registry().add(kind, std::move(f));
  register_model_kind(kind, model_family::classifier);  // a job config may now name it
}

std::vector<std::string> registered_models() {
  return registry().names();
}

namespace {
// The host factory of c.kind, after the checks every model passes, on a
// device or not.
model_factory checked_factory(const model_config& c, const model_shape& s) {
  auto f = registry().find(c.kind);
  if (!f)
    throw std::invalid_argument("model.kind: unknown model '" + c.kind +
                                "' (registered: " + registry().known() + ")");
  check_model_size(c, s.features, s.classes);
  return f;
}
}  // namespace

std::unique_ptr<model> create_model(const model_config& c, const model_shape& s, uint64_t seed) {
  return checked_factory(c, s)(c, s, seed);
}

namespace {
named_registry<device_model_factory>& device_registry() {
  static named_registry<device_model_factory> r{
      "device model kind", {{"mlp", &make_mlp_on}, {"layers", &make_layer_model_on}}};
  return r;
}
}  // namespace

void register_device_model(const std::string& kind, device_model_factory f) {
  device_registry().add(kind, std::move(f));
}

bool has_device_model(const std::string& kind) {
  return static_cast<bool>(device_registry().find(kind));
}

std::unique_ptr<model> create_model_on(const model_config& c, const model_shape& s, uint64_t seed,
                                       std::shared_ptr<device_context> ctx) {
  auto f = device_registry().find(c.kind);
  if (!ctx || (ctx->shares_host_memory() && !f)) return create_model(c, s, seed);
  if (!f)
    throw std::invalid_argument(
        "model.kind: '" + c.kind + "' has no device implementation, so it cannot run on " +
        ctx->spec().str() + " (models that can: " + device_registry().known() + ")");
  checked_factory(c, s);
  return f(c, s, seed, std::move(ctx));
}

int64_t dense_parameter_count(const model_config& c, int64_t inputs, int64_t outputs) {
  int64_t total = 0;
  int64_t in = inputs;
  auto layer = [&](int64_t out) {
    int64_t w = 0;
    return !__builtin_mul_overflow(in, out, &w) && !__builtin_add_overflow(total, w, &total) &&
           !__builtin_add_overflow(total, out, &total);
  };
  for (auto h : c.hidden) {
    if (!layer(h)) return -1;
    in = h;
  }
  return layer(outputs) ? total : -1;
}

void check_model_size(const model_config& c, int64_t inputs, int64_t outputs) {
  if (!c.layers.is_null()) return;  // a layer model counts its own (check_layer_model)
  auto n = dense_parameter_count(c, inputs, outputs);
  if (n >= 0 && n <= kMaxModelParameters) return;
  std::ostringstream what;
  what << "model.hidden: a " << inputs;
  for (auto h : c.hidden) what << '-' << h;
  what << '-' << outputs << " network has ";
  if (n < 0)
    what << "more than 2^63";
  else
    what << n;
  what << " parameters; at most " << kMaxModelParameters << " (2^28) are allowed";
  throw std::invalid_argument(what.str());
}

void restore_buffers(std::vector<named_tensor>& bufs, const std::vector<named_tensor>& saved) {
  std::map<std::string, const tensor*> by_name;
  for (auto& v : saved) by_name[v.name] = &v.value;
  for (int pass = 0; pass < 2; ++pass)
    for (auto& b : bufs) {
      auto i = by_name.find(b.name);
      if (i == by_name.end()) continue;
      if (pass == 0 &&
          (i->second->shape() != b.value.shape() || i->second->type() != b.value.type()))
        throw std::runtime_error("checkpoint state '" + b.name + "' has shape " +
                                 shape_string(i->second->shape()) + ", the model expects " +
                                 shape_string(b.value.shape()));
      if (pass == 1) b.value = i->second->clone();
    }
}

int64_t restore_variables_and_slots(std::vector<named_tensor>& vars, kernels::optimizer& opt,
                                    const std::vector<named_tensor>& variables,
                                    const std::vector<named_tensor>& slots) {
  std::map<std::string, const tensor*> by_name;
  for (auto& v : variables) by_name[v.name] = &v.value;
  for (auto& v : vars) {
    auto i = by_name.find(v.name);
    if (i == by_name.end()) throw std::runtime_error("checkpoint has no variable '" + v.name + "'");
    if (i->second->shape() != v.value.shape() || i->second->type() != v.value.type())
      throw std::runtime_error("checkpoint variable '" + v.name + "' has shape " +
                               shape_string(i->second->shape()) + ", the model expects " +
                               shape_string(v.value.shape()));
  }
  if (by_name.size() != vars.size())
    throw std::runtime_error("checkpoint has " + std::to_string(by_name.size()) +
                             " variables, the model has " + std::to_string(vars.size()));
  for (auto& v : vars) v.value = by_name[v.name]->clone();
  opt.load_state(slots);
  return opt.step();
}

}  // namespace troupe
