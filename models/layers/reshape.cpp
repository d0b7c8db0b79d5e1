// flatten: any shape -> [n]; reshape: to "shape" (one entry may be -1: what
// is left). Views: no copy, no work.
#include "models/layers/keys.hpp"

namespace troupe::layers {
namespace {

class view final : public layer {
 public:
  explicit view(shape out) { out_ = std::move(out); }
  bool is_view() const override { return true; }
  void forward(run_context&, const float*, float*) override {}
  void backward(run_context&, const float*, const float*, float*, float*) override {}
};

}  // namespace

std::unique_ptr<layer> build_flatten(const json& spec, const std::string& path, const shape& in,
                                     const json*, build_context&) {
  object_reader r(spec, path, {"type"});
  return std::make_unique<view>(shape{numel(in)});
}

std::unique_ptr<layer> build_reshape(const json& spec, const std::string& path, const shape& in,
                                     const json*, build_context&) {
  object_reader r(spec, path, {"type", "shape"});
  const json* s = r.get("shape");
  const auto p = r.path("shape");
  if (!s || !s->is_array() || s->empty() || s->size() > 4)
    json_read::expected(p, "an array of 1 to 4 integers >= 1 (one may be -1)",
                        s ? *s : json(nullptr));
  shape out;
  int64_t known = 1, free_at = -1;
  for (std::size_t i = 0; i < s->size(); ++i) {
    if ((*s)[i] == -1 && free_at < 0) {
      free_at = static_cast<int64_t>(i);
      out.push_back(-1);
      continue;
    }
    out.push_back(json_read::read_int_in((*s)[i], json_read::index(p, i), 1, int64_t{1} << 31));
    known *= out.back();
  }
  const int64_t n = numel(in);
  if (free_at >= 0 && n % known == 0) out[static_cast<std::size_t>(free_at)] = n / known;
  if (free_at >= 0 ? n % known != 0 : known != n)
    json_read::fail(p, "reshape cannot turn " + describe(in) + " (" + std::to_string(n) +
                           " values) into " + s->dump());
  return std::make_unique<view>(std::move(out));
}

}  // namespace troupe::layers
