#include "envs/plugin_env.hpp"

#include <dlfcn.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include "envs/python_env.hpp"
#include "envs/troupe_env_plugin.h"

namespace troupe::envs {
namespace {

const char* const kFunctionNames[] = {"create", "describe",   "reset",
                                      "step",   "last_error", "destroy"};

// The first of the table's required functions that is missing, or nullptr.
const char* missing_function(const troupe_env_plugin_api& api) {
  const void* functions[] = {
      reinterpret_cast<const void*>(api.create),     reinterpret_cast<const void*>(api.describe),
      reinterpret_cast<const void*>(api.reset),      reinterpret_cast<const void*>(api.step),
      reinterpret_cast<const void*>(api.last_error), reinterpret_cast<const void*>(api.destroy)};
  for (std::size_t f = 0; f < std::size(functions); ++f)
    if (!functions[f]) return kFunctionNames[f];
  return nullptr;
}

// Opens the library and checks its entry and ABI version; the table stays
// valid for the process's life (the library is never closed once accepted).
const troupe_env_plugin_api& open_plugin(const std::string& library) {
  static std::mutex mutex;
  static std::map<std::string, const troupe_env_plugin_api*> loaded;
  const auto path = plugin_library_path(library);
  std::lock_guard lock(mutex);  // dlerror's text is per thread, the map is not
  if (auto it = loaded.find(path); it != loaded.end()) return *it->second;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw env_start_error("rl.env.library",
                          "cannot load the plugin '" + library + "': " + std::string(dlerror()));
  auto refuse = [&](const std::string& why) {
    dlclose(handle);
    throw env_start_error("rl.env.library", "'" + path + "' " + why);
  };
  dlerror();
  void* entry = dlsym(handle, TROUPE_ENV_PLUGIN_ENTRY);
  if (!entry)
    refuse("exports no function " TROUPE_ENV_PLUGIN_ENTRY
           ": it is not a troupe environment plugin (envs/troupe_env_plugin.h)");
  const auto* api = reinterpret_cast<troupe_env_plugin_entry>(entry)();
  if (!api) refuse("returned no function table from " TROUPE_ENV_PLUGIN_ENTRY "()");
  if (api->abi_version != TROUPE_ENV_PLUGIN_ABI_VERSION)
    refuse("was built for plugin ABI version " + std::to_string(api->abi_version) +
           ", this troupe takes version " + std::to_string(TROUPE_ENV_PLUGIN_ABI_VERSION) +
           ": rebuild it against this troupe's envs/troupe_env_plugin.h");
  if (const char* f = missing_function(*api))
    refuse("has no " + std::string(f) + " function in its table (NULL)");
  loaded.emplace(path, api);
  return *api;
}

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// The spec of what describe() reported, or env_start_error (rl.env) naming
// what troupe's models and policy heads cannot take.
env_spec spec_of(const troupe_env_info& info, const std::string& id) {
  auto refuse = [&](const std::string& why) {
    throw env_start_error("rl.env", "'" + id + "' " + why);
  };
  if (info.observation_dtype != TROUPE_DTYPE_FLOAT32)
    refuse("has observations of dtype " + std::to_string(info.observation_dtype) +
           ", which the policy/value model's input layer cannot take: it takes a Box of float32 "
           "(TROUPE_DTYPE_FLOAT32)");
  if (info.observation_size < 1)
    refuse("has an observation of " + std::to_string(info.observation_size) +
           " floats: expected at least 1");
  if (info.max_episode_steps < 1)
    refuse("has max_episode_steps " + std::to_string(info.max_episode_steps) +
           ": expected at least 1");
  env_spec s;
  s.name = info.name && *info.name ? info.name : id;
  s.observation_size = info.observation_size;
  s.max_episode_steps = info.max_episode_steps;
  const std::string heads =
      ", which no policy head takes: the softmax head takes Discrete(n), the gaussian one a Box "
      "of floats";
  if (info.action_space == TROUPE_SPACE_MULTI_DISCRETE)
    refuse("has the action space MultiDiscrete(" + std::to_string(info.action_n) + " parts)" +
           heads);
  if (info.action_space != TROUPE_SPACE_DISCRETE && info.action_space != TROUPE_SPACE_BOX)
    refuse("has an action space of kind " + std::to_string(info.action_space) + heads);
  if (info.action_n < 1)
    refuse("has " + std::to_string(info.action_n) +
           " actions (or dimensions): expected at least 1");
  if (info.action_space == TROUPE_SPACE_DISCRETE) {
    s.actions = info.action_n;
    return s;
  }
  if (!info.action_low || !info.action_high) refuse("has a Box action space without bounds");
  for (int64_t d = 0; d < info.action_n; ++d) {
    const float lo = info.action_low[d], hi = info.action_high[d];
    if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi)
      refuse("has a Box action space whose dimension " + std::to_string(d) + " is [" + number(lo) +
             ", " + number(hi) + "]: expected finite bounds, low <= high");
    s.action_low.push_back(lo);
    s.action_high.push_back(hi);
  }
  return s;
}

class plugin_vector_env final : public vector_env {
 public:
  plugin_vector_env(const troupe_env_plugin_api& api, const plugin_env_config& p, int64_t instances)
      : api_(api), library_(p.library), n_(instances) {
    if (instances < 1)
      throw std::invalid_argument(p.id + ": expected at least 1 instance, got " +
                                  std::to_string(instances));
    char error[1024] = {};
    env_ = api_.create(p.id.c_str(), instances, p.kwargs.c_str(), error, sizeof error);
    if (!env_) {
      error[sizeof error - 1] = '\0';  // a plugin that filled it to the end
      throw env_start_error("rl.env", "the plugin '" + library_ + "' cannot make '" + p.id +
                                          "' with kwargs " + p.kwargs + ": " +
                                          (*error ? error : "(no message)"));
    }
    troupe_env_info info{};
    spec_.name = p.id;  // for a failing describe's message
    try {
      if (api_.describe(env_, &info) != 0) fail("describe");
      spec_ = spec_of(info, p.id);
    } catch (...) {
      api_.destroy(env_);  // no destructor runs after a constructor throws
      throw;
    }
    if (api_.get_state && api_.set_state) state_size_ = std::max<int64_t>(0, info.state_size);
    steps_.assign(static_cast<std::size_t>(n_), 0);
    returns_.assign(static_cast<std::size_t>(n_), 0.0);
  }

  ~plugin_vector_env() override { api_.destroy(env_); }
  plugin_vector_env(const plugin_vector_env&) = delete;
  plugin_vector_env& operator=(const plugin_vector_env&) = delete;

  const env_spec& spec() const override { return spec_; }
  int64_t size() const override { return n_; }
  int64_t state_size() const override { return state_size_; }

  void reset(uint64_t seed, float* obs) override {
    if (api_.reset(env_, seed, obs) != 0) fail("reset");
    std::fill(steps_.begin(), steps_.end(), 0);
    std::fill(returns_.begin(), returns_.end(), 0.0);
  }

  void step(const int32_t* actions, const step_output& out) override {
    check_discrete_actions(spec_, n_, actions);
    advance(actions, out);
  }

  void step_box(const float* actions, const step_output& out) override {
    check_box_actions(spec_, n_, actions);
    advance(actions, out);
  }

  void get_state(int64_t instance, double* state) const override {
    if (api_.get_state(env_, checked(instance), state) != 0) fail("get_state");
  }

  void set_state(int64_t instance, const double* state) override {
    if (api_.set_state(env_, checked(instance), state) != 0) fail("set_state");
  }

 private:
  // The plugin steps and auto-resets; the episodes' returns and lengths are
  // counted here, as batch_env counts them for the built-ins.
  void advance(const void* actions, const step_output& out) {
    const troupe_env_step_out plugin_out{out.obs, out.reward, out.terminated, out.truncated,
                                         out.final_obs};
    if (api_.step(env_, actions, &plugin_out) != 0) fail("step");
    for (int64_t i = 0; i < n_; ++i) {
      const auto k = static_cast<std::size_t>(i);
      // Flags as 0 or 1, and the MDP's end wins over the time limit.
      out.terminated[i] = out.terminated[i] != 0;
      out.truncated[i] = !out.terminated[i] && out.truncated[i] != 0;
      ++steps_[k];
      returns_[k] += out.reward[i];
      out.episode_return[i] = 0;
      out.episode_length[i] = 0;
      if (!out.terminated[i] && !out.truncated[i]) continue;
      out.episode_return[i] = returns_[k];
      out.episode_length[i] = steps_[k];
      steps_[k] = 0;
      returns_[k] = 0;
    }
  }

  [[noreturn]] void fail(const std::string& function) const {
    const char* message = api_.last_error(env_);
    throw std::runtime_error(spec_.name + " (plugin '" + library_ + "'): " + function +
                             " failed: " + (message && *message ? message : "(no message)"));
  }

  int64_t checked(int64_t instance) const {
    if (instance < 0 || instance >= n_ || state_size_ == 0)
      throw std::out_of_range(spec_.name + ": no state of instance " + std::to_string(instance) +
                              " of " + std::to_string(n_) +
                              (state_size_ == 0 ? " (the plugin has no get_state/set_state)" : ""));
    return instance;
  }

  const troupe_env_plugin_api& api_;
  std::string library_;
  int64_t n_;
  troupe_env* env_ = nullptr;
  env_spec spec_;
  int64_t state_size_ = 0;
  std::vector<int64_t> steps_;   // steps of the running episode
  std::vector<double> returns_;  // return of the running episode
};

}  // namespace

std::string plugin_library_path(const std::string& library) {
  const std::filesystem::path path = library;
  if (path.is_absolute()) return library;
#ifdef TROUPE_PLUGIN_DIR
  std::error_code ec;
  const auto built = std::filesystem::path(TROUPE_PLUGIN_DIR) / path;
  if (std::filesystem::is_regular_file(built, ec)) return built.string();
#endif
  return library;
}

std::unique_ptr<vector_env> make_plugin_env(const plugin_env_config& p, int64_t instances) {
  return std::make_unique<plugin_vector_env>(open_plugin(p.library), p, instances);
}

}  // namespace troupe::envs
