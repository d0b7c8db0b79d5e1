// Plugins that misbehave, one source built three ways (tests/CMakeLists.txt),
// for tests/test_env_plugin.cpp:
//   BROKEN_NO_ENTRY  exports no troupe_env_plugin at all;
//   BROKEN_ABI       reports ABI version 99;
//   (neither)        a sound table whose environments misbehave by id:
//                    "FailingStep-v0" fails its third step, "Pairs-v0" has a
//                    MultiDiscrete action space, "Bytes-v0" uint8
//                    observations (dtype 2), "Unbounded-v0" a Box action
//                    space with an infinite bound.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "troupe_env_plugin.h"

struct troupe_env {
  std::string id;
  int64_t n = 0;
  int steps = 0;
  std::string error;
};

namespace {

const float kLow[] = {-1.0f}, kHigh[] = {INFINITY};

troupe_env_info info_of(const troupe_env& e) {
  troupe_env_info info{
      e.id.c_str(), TROUPE_DTYPE_FLOAT32, 3, TROUPE_SPACE_DISCRETE, 2, nullptr, nullptr, 10, 0};
  if (e.id == "Pairs-v0") info.action_space = TROUPE_SPACE_MULTI_DISCRETE;
  if (e.id == "Bytes-v0") info.observation_dtype = 2;
  if (e.id == "Unbounded-v0") {
    info.action_space = TROUPE_SPACE_BOX;
    info.action_n = 1;
    info.action_low = kLow;
    info.action_high = kHigh;
  }
  return info;
}

const troupe_env_plugin_api kApi = {
#ifdef BROKEN_ABI
    99,
#else
    TROUPE_ENV_PLUGIN_ABI_VERSION,
#endif
    [](const char* id, int64_t n, const char*, char* error, size_t capacity) -> troupe_env* {
      const std::string known[] = {"FailingStep-v0", "Pairs-v0", "Bytes-v0", "Unbounded-v0"};
      for (const auto& k : known)
        if (k == id) return new troupe_env{id, n, 0, ""};
      std::snprintf(error, capacity, "no environment '%s' here", id);
      return nullptr;
    },
    [](troupe_env* env, troupe_env_info* info) {
      *info = info_of(*env);
      return 0;
    },
    [](troupe_env* env, uint64_t, float* obs) {
      std::memset(obs, 0, sizeof(float) * 3 * static_cast<size_t>(env->n));
      return 0;
    },
    [](troupe_env* env, const void*, const troupe_env_step_out* out) {
      if (++env->steps == 3) {
        env->error = "the pole snapped at step 3";
        return 7;
      }
      for (int64_t i = 0; i < env->n; ++i) {
        out->reward[i] = 1.0f;
        out->terminated[i] = out->truncated[i] = 0;
        for (int c = 0; c < 3; ++c) out->obs[i * 3 + c] = 0.0f;
      }
      return 0;
    },
    [](troupe_env* env) { return env->error.c_str(); },
    [](troupe_env* env) { delete env; },
    nullptr,
    nullptr,
};

}  // namespace

#ifdef BROKEN_NO_ENTRY
extern "C" TROUPE_ENV_PLUGIN_EXPORT const troupe_env_plugin_api* not_the_entry(void) {
  return &kApi;
}
#else
const troupe_env_plugin_api* troupe_env_plugin(void) {
  return &kApi;
}
#endif
