#pragma once
// model.kind "layers": a network composed in the job config from the layers
// of models/layers/ (dense, conv2d, pooling, normalisation, dropout,
// embedding, residual blocks, ...) and a loss (model.loss:
// softmax_cross_entropy on class labels, binary_cross_entropy on logits or
// mse on float targets). The MLP is one of these: a stack of dense layers.
#include <memory>

#include "models/model.hpp"

namespace troupe {

std::unique_ptr<model> make_layer_model(const model_config& c, const model_shape& s, uint64_t seed);
// The same model computing on `ctx`'s device (null: the host).
std::unique_ptr<model> make_layer_model_on(const model_config& c, const model_shape& s,
                                           uint64_t seed, std::shared_ptr<device_context> ctx);

// Builds the layers of `c` over the input of `s` on the host and throws
// config_error naming the JSON path of the first that is wrong (type, key,
// range or a shape it cannot take) or a last layer whose output does not fit
// the loss and the data. Returns the parameter count.
int64_t check_layer_model(const model_config& c, const model_shape& s);

// Whether a model of `c` has batch norm layers that synchronise their
// statistics over replicas (model::synced_statistics), read from the config
// alone (the runtime decides the replicas' group before building models).
bool uses_synced_statistics(const model_config& c);
// Whether a model of `c` has buffers (model::buffers(): batch norm layers).
bool has_model_buffers(const model_config& c);

}  // namespace troupe
