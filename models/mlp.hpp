#pragma once
#include <memory>

#include "models/model.hpp"

namespace troupe {

// Multi-layer perceptron classifier: features -> hidden... -> classes, with
// ReLU or tanh between dense layers and softmax cross-entropy on top.
// Variables: "dense_<i>/kernel" [in,out] and "dense_<i>/bias" [out].
// Kernels are initialised seeded: He normal (ReLU) or Glorot uniform (tanh);
// biases start at zero.
std::unique_ptr<model> make_mlp(const model_config& c, const model_shape& s, uint64_t seed);
// The same model computing on `ctx`'s device (null: the host).
std::unique_ptr<model> make_mlp_on(const model_config& c, const model_shape& s, uint64_t seed,
                                   std::shared_ptr<device_context> ctx);

}  // namespace troupe
