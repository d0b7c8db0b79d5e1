// embedding: integer ids [L] (as the data gives them: numbers, each in
// [0, vocab)) -> their rows of table[vocab, dim]: [L, dim], or with
// "pool": "mean" the mean of the L rows, [dim] (a bag of ids). Only first:
// it reads the data's ids, which the model checks on the host (a device
// cannot throw). table starts N(0, 1), as PyTorch's nn.Embedding.
#include <cmath>

#include "models/layers/keys.hpp"
#include "models/random.hpp"

namespace troupe::layers {
namespace {

class embedding final : public layer {
 public:
  embedding(int64_t len, int64_t vocab, int64_t dim, bool bag)
      : len_(len), vocab_(vocab), dim_(dim), bag_(bag) {
    out_ = bag ? shape{dim} : shape{len, dim};
  }
  void forward(run_context& rc, const float* x, float* y) override {
    rc.ops->embedding_forward(x, rc.vars[first_var], y, rc.batch, len_, dim_, bag_);
  }
  void backward(run_context& rc, const float* x, const float*, float* dy, float*) override {
    rc.ops->embedding_backward(x, dy, rc.grads[first_var], rc.batch, len_, vocab_, dim_, bag_,
                               rc.accumulate);
  }

 private:
  int64_t len_, vocab_, dim_;
  bool bag_;
};

}  // namespace

std::unique_ptr<layer> build_embedding(const json& spec, const std::string& path, const shape& in,
                                       const json*, build_context& bc) {
  object_reader r(spec, path, {"type", "vocab", "dim", "pool"});
  if (bc.layers_built != 0)
    json_read::fail(path, "embedding must be the first layer: it reads the data's integer ids");
  if (in.size() != 1) needs_input(path, "embedding", "[ids]", in);
  int64_t vocab = 0, dim = 0;
  // Ids travel as float32, exact up to 2^24.
  r.with("vocab", [&](const json& v, const std::string& p) {
    vocab = json_read::read_int_in(v, p, 1, int64_t{1} << 24);
  });
  r.with("dim", [&](const json& v, const std::string& p) {
    dim = json_read::read_int_in(v, p, 1, 1 << 16);
  });
  if (!vocab) json_read::fail(r.path("vocab"), "missing: the number of ids, an integer >= 1");
  if (!dim) json_read::fail(r.path("dim"), "missing: the vector size, an integer >= 1");
  bool bag = false;
  r.with("pool", [&](const json& v, const std::string& p) {
    bag = json_read::read_enum(v, p, {"none", "mean"}) == "mean";
  });
  bc.reserve(path, {vocab, dim});
  auto l = std::make_unique<embedding>(in[0], vocab, dim, bag);
  tensor table = bc.zeros({vocab, dim});
  splitmix64 g(derive_seed(bc.seed, bc.next_stream++));
  for (int64_t i = 0; i < table.numel(); ++i) table.f32()[i] = static_cast<float>(g.normal());
  l->first_var = bc.add_variable(bc.name_for("embedding") + "/table", std::move(table));
  l->last_var = bc.vars->size();
  return l;
}

}  // namespace troupe::layers
