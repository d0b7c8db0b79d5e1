#include "models/layers/keys.hpp"

#include <cmath>

#include "models/random.hpp"

namespace troupe::layers {

int64_t numel(const shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string describe(const shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

hw read_hw(const json& v, const std::string& path, int64_t min) {
  if (v.is_array()) {
    if (v.size() != 2)
      json_read::expected(path, "an integer or [h, w] of integers >= " + std::to_string(min), v);
    return {json_read::read_int_in(v[0], json_read::index(path, 0), min, 1 << 16),
            json_read::read_int_in(v[1], json_read::index(path, 1), min, 1 << 16)};
  }
  int64_t x = json_read::read_int_in(v, path, min, 1 << 16);
  return {x, x};
}

padding read_padding(const json& v, const std::string& path, hw in, hw kernel, hw stride) {
  if (v.is_string()) {
    auto s = json_read::read_enum(v, path, {"valid", "same"});
    if (s == "valid") return {};
    auto total = [](int64_t n, int64_t k, int64_t st) {
      int64_t out = (n + st - 1) / st;
      return std::max<int64_t>((out - 1) * st + k - n, 0);
    };
    int64_t th = total(in.h, kernel.h, stride.h), tw = total(in.w, kernel.w, stride.w);
    return {th / 2, tw / 2, th - th / 2, tw - tw / 2};
  }
  if (!v.is_number_integer() && !v.is_array())
    json_read::expected(path, "\"valid\", \"same\", an integer or [h, w]", v);
  hw p = read_hw(v, path, 0);
  return {p.h, p.w, p.h, p.w};
}

std::string read_init(const object_reader& r) {
  std::string init = "auto";
  r.with("init", [&](const json& v, const std::string& p) {
    init = json_read::read_enum(v, p, {"auto", "he", "glorot"});
  });
  return init;
}

std::string type_of(const json* spec) {
  if (!spec || !spec->is_object()) return "";
  auto it = spec->find("type");
  return it != spec->end() && it->is_string() ? it->get<std::string>() : "";
}

std::string resolve_init(const std::string& init, const json* next) {
  if (init != "auto") return init;
  auto t = type_of(next);
  return t == "relu" || t == "leaky_relu" || t == "gelu" ? "he" : "glorot";
}

void init_kernel(tensor& t, const std::string& init, int64_t fan_in, int64_t fan_out, uint64_t seed,
                 uint64_t stream) {
  splitmix64 g(derive_seed(seed, stream));
  float* p = t.f32();
  const int64_t n = t.numel();
  if (init == "he") {
    double sd = std::sqrt(2.0 / static_cast<double>(fan_in));
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(g.normal() * sd);
  } else {
    double a = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((2 * g.uniform() - 1) * a);
  }
}

void needs_input(const std::string& path, const std::string& type, const std::string& what,
                 const shape& got) {
  json_read::fail(path, type + " needs a " + what + " input, got " + describe(got));
}

std::string build_context::name_for(const std::string& type) {
  for (auto& [t, n] : counters)
    if (t == type) return type + "_" + std::to_string(n++);
  counters.emplace_back(type, 1);
  return type + "_0";
}

void build_context::reserve(const std::string& path, std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  bool over = false;
  for (auto d : dims) over = over || __builtin_mul_overflow(n, d, &n);
  over = over || __builtin_add_overflow(parameters, n, &parameters);
  if (over || parameters > (int64_t{1} << 28))
    json_read::fail(path, "the model would have more than 2^28 parameters");
}

tensor build_context::zeros(shape_t s, float v) const {
  if (dry_run) return {};
  tensor t(std::move(s));
  if (v != 0.0f) t.fill(v);
  return t;
}

std::size_t build_context::add_variable(const std::string& name, tensor value) {
  vars->push_back({name, std::move(value)});
  return vars->size() - 1;
}

std::size_t build_context::add_buffer(const std::string& name, tensor value) {
  buffers->push_back({name, std::move(value)});
  return buffers->size() - 1;
}

}  // namespace troupe::layers
