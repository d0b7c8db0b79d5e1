#pragma once
// Reading a layer's keys: the pairs (kernel, stride, dilation: an integer or
// [h, w]), padding, the kernel initialisation, each error naming the JSON
// path; and the seeded initialisers every layer with a kernel uses.
#include <string>
#include <utility>

#include "config/json_read.hpp"
#include "models/layers/layer.hpp"

namespace troupe::layers {

using json = nlohmann::json;
using json_read::object_reader;

struct hw {
  int64_t h = 1, w = 1;
};
// An integer >= min, or [h, w] of them.
hw read_hw(const json& v, const std::string& path, int64_t min);

// Padding of a window of `kernel` (dilated extent) moving by `stride` over
// `in`: "valid" (none), "same" (output = ceil(in / stride), the extra row or
// column at the bottom/right, as TensorFlow does), an integer or [h, w] on
// both sides.
struct padding {
  int64_t top = 0, left = 0, bottom = 0, right = 0;
};
padding read_padding(const json& v, const std::string& path, hw in, hw kernel, hw stride);

// "auto" resolves by the activation after the layer: He (normal, std
// sqrt(2 / fan_in)) before relu, leaky_relu and gelu, Glorot (uniform,
// limit sqrt(6 / (fan_in + fan_out))) otherwise.
// A window's size, stride and padding into a conv2d_shape or pool2d_shape.
template <class Shape>
void set_window(Shape& s, hw kernel, hw stride, const padding& pad) {
  s.kernel_h = kernel.h;
  s.kernel_w = kernel.w;
  s.stride_h = stride.h;
  s.stride_w = stride.w;
  s.pad_top = pad.top;
  s.pad_left = pad.left;
  s.pad_bottom = pad.bottom;
  s.pad_right = pad.right;
}

std::string read_init(const object_reader& r);
std::string resolve_init(const std::string& init, const json* next);
// Fills t seeded from stream `stream` of the job seed.
void init_kernel(tensor& t, const std::string& init, int64_t fan_in, int64_t fan_out, uint64_t seed,
                 uint64_t stream);

// The type of a layer spec ("" when it has none).
std::string type_of(const json* spec);
// "model.layers[3]: conv2d needs a [C,H,W] input, got [784]".
[[noreturn]] void needs_input(const std::string& path, const std::string& type,
                              const std::string& what, const shape& got);

}  // namespace troupe::layers
