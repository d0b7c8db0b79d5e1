#include "envs/torso.hpp"

namespace troupe::envs {
namespace {

std::string describe_shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// The observation space as messages show it: its shape and dtype.
std::string observation_space(const env_spec& spec) {
  const auto shape = spec.observation_shape.empty() ? std::vector<int64_t>{spec.observation_size}
                                                    : spec.observation_shape;
  return "Box" + describe_shape(shape) + " " + spec.observation_dtype;
}

// The smallest image whose height and width the three convs fit into.
constexpr int64_t kNatureMinSide = 36;

}  // namespace

bool image_observation(const env_spec& spec) {
  const auto rank = spec.observation_shape.size();
  return rank == 2 || rank == 3;
}

nlohmann::json nature_cnn_layers(const env_spec& spec) {
  const auto& s = spec.observation_shape;
  const bool image = image_observation(spec);
  const int64_t h = image ? s[s.size() - 2] : 0, w = image ? s.back() : 0;
  if (!image || h < kNatureMinSide || w < kNatureMinSide)
    throw config_error("rl.torso",
                       "'" + spec.name + "' has the observation space " + observation_space(spec) +
                           ", which the nature_cnn torso's first layer (conv2d_0: 32 filters, 8x8, "
                           "stride 4) cannot take: it takes an image, [C,H,W] or [H,W], of at "
                           "least " +
                           std::to_string(kNatureMinSide) + "x" + std::to_string(kNatureMinSide) +
                           " (\"mlp\" takes any observation, flattened)");
  const int64_t channels = s.size() == 3 ? s[0] : 1;
  auto conv = [](int64_t filters, int64_t kernel, int64_t stride) {
    return nlohmann::json{
        {"type", "conv2d"}, {"filters", filters}, {"kernel", kernel}, {"stride", stride}};
  };
  return nlohmann::json::array({{{"type", "reshape"}, {"shape", {channels, h, w}}},
                                conv(32, 8, 4),
                                {{"type", "relu"}},
                                conv(64, 4, 2),
                                {{"type", "relu"}},
                                conv(64, 3, 1),
                                {{"type", "relu"}},
                                {{"type", "flatten"}},
                                {{"type", "dense"}, {"units", 512}},
                                {{"type", "relu"}}});
}

model_config rl_model_for(const env_spec& spec, const model_config& model,
                          const std::string& torso) {
  const bool conv = torso == "nature_cnn" || (torso == "auto" && model.kind == "policy_value_mlp" &&
                                              image_observation(spec));
  if (!conv) return model;
  model_config m = model;
  m.kind = "policy_value_layers";
  m.layers = nature_cnn_layers(spec);
  return m;
}

}  // namespace troupe::envs
