/* troupe's native environment plugins: a user's C or C++ environment in a
 * shared library, named in a job's config as
 *
 *   "rl": {"env": {"kind": "plugin", "library": "libmyenv.so", "id": "MyEnv-v0",
 *                  "kwargs": {...}}}
 *
 * The library exports one C function, troupe_env_plugin (below), returning
 * a table of functions (troupe_env_plugin_api). Only C types cross this boundary, so a plugin may
 * be built with another compiler or standard library than troupe. The table begins with the ABI
 * version it was built against; troupe refuses a library whose version differs from its own
 * (TROUPE_ENV_PLUGIN_ABI_VERSION), naming both. A later ABI adds a version, never changes this one.
 *
 * Semantics (the same as troupe's built-in environments, envs/env.hpp):
 * a plugin environment is a batch of `instances` environments of one kind,
 * stepped together by one call. Each step, every instance takes its action
 * and reports its reward, `terminated` (the MDP ended: no value after it)
 * and `truncated` (the plugin's own time limit, max_episode_steps, cut it).
 * An instance whose episode ended (either flag) starts a new one IN THE SAME
 * STEP (auto-reset): `obs` then holds the new episode's first observation and
 * `final_obs` the observation the old one ended in. troupe counts each
 * episode's return and length itself.
 *
 * Threading: troupe calls the functions of one environment handle from one
 * thread at a time (each rl_actor owns its handles; the actors of a job may
 * run in parallel on different handles), so a handle needs no locks; state
 * shared between handles (globals) does.
 *
 * Memory: every buffer is the caller's, sized as each function says; a
 * plugin keeps no pointer to one after the call returns. Strings and arrays
 * a plugin returns (name, action bounds, error messages) are the plugin's
 * and must stay valid as the function says.
 *
 * Return codes: 0 is success; anything else is a failure, whose message
 * troupe reads from last_error(handle) and reports naming the environment.
 */
#ifndef TROUPE_ENV_PLUGIN_H
#define TROUPE_ENV_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TROUPE_ENV_PLUGIN_ABI_VERSION 1

/* The observation space is always a Box of float32 (flattened: shape does
 * not matter, only the count); other dtypes are refused. */
#define TROUPE_DTYPE_FLOAT32 1

/* Action spaces. A Discrete(n) action is one int32 in [0, n); a Box action
 * is `n` float32s, which the plugin clips to its bounds (troupe passes only
 * finite numbers). MultiDiscrete is described so that troupe can refuse it
 * by name: no policy head takes it yet. */
#define TROUPE_SPACE_DISCRETE 1
#define TROUPE_SPACE_BOX 2
#define TROUPE_SPACE_MULTI_DISCRETE 3

/* What describe() fills in. */
typedef struct troupe_env_info {
  const char* name;          /* e.g. "CartPole-v1"; valid until destroy */
  int32_t observation_dtype; /* TROUPE_DTYPE_FLOAT32 */
  int64_t observation_size;  /* floats per instance's observation, >= 1 */
  int32_t action_space;      /* TROUPE_SPACE_* */
  int64_t action_n;          /* Discrete: n; Box: dimensions; MultiDiscrete: parts */
  const float* action_low;   /* Box: action_n lower bounds; else NULL */
  const float* action_high;  /* Box: action_n upper bounds; else NULL */
  int64_t max_episode_steps; /* the time limit at which the plugin truncates, >= 1 */
  int64_t state_size;        /* doubles of get_state/set_state; 0: none */
} troupe_env_info;

/* Where step() writes; each array has room for the batch's `instances`
 * entries (obs and final_obs: instances * observation_size floats). */
typedef struct troupe_env_step_out {
  float* obs;
  float* reward;
  uint8_t* terminated; /* 0 or 1 */
  uint8_t* truncated;  /* 0 or 1; never 1 where terminated is */
  float* final_obs;    /* written only for the rows of instances whose episode ended */
} troupe_env_step_out;

typedef struct troupe_env troupe_env; /* the plugin's own type, opaque to troupe */

typedef struct troupe_env_plugin_api {
  /* TROUPE_ENV_PLUGIN_ABI_VERSION as the plugin was compiled. */
  uint32_t abi_version;

  /* A batch of `instances` (>= 1) environments of kind `id` (one library
   * may make several kinds), configured by `kwargs_json`: the config's
   * rl.env.kwargs as a JSON object's text ("{}" when none), NUL-terminated.
   * NULL on failure, with a NUL-terminated message in `error` (at most
   * error_capacity bytes, the NUL included): an unknown id, a bad keyword
   * argument. Episodes start only at reset(). */
  troupe_env* (*create)(const char* id, int64_t instances, const char* kwargs_json, char* error,
                        size_t error_capacity);

  /* The spaces and limits of `env`; the pointers in *info stay valid until
   * destroy(env). */
  int (*describe)(troupe_env* env, troupe_env_info* info);

  /* Starts an episode in every instance and writes their observations to
   * obs [instances * observation_size]. Instance i draws its start from its
   * own random stream, a function of (seed, i) only, and every later
   * episode (auto-reset) from the same stream: the same seed gives the same
   * episodes on every machine. */
  int (*reset)(troupe_env* env, uint64_t seed, float* obs);

  /* One step of every instance. `actions`: instances int32s for Discrete,
   * instances * action_n float32s (row i: instance i) for a Box. troupe has
   * checked them: discrete ones in range, Box ones finite. */
  int (*step)(troupe_env* env, const void* actions, const troupe_env_step_out* out);

  /* The message of the last failed call on `env`, NUL-terminated; valid
   * until the next call on `env`. Never NULL. */
  const char* (*last_error)(troupe_env* env);

  /* Releases `env`; troupe never uses it after. */
  void (*destroy)(troupe_env* env);

  /* Optional (NULL when state_size is 0): the simulator's state of one
   * instance as state_size doubles, to replay or test from a known state;
   * set_state keeps the episode's step count. */
  int (*get_state)(troupe_env* env, int64_t instance, double* state);
  int (*set_state)(troupe_env* env, int64_t instance, const double* state);
} troupe_env_plugin_api;

/* The one symbol a plugin exports, defined as
 *
 *   TROUPE_ENV_PLUGIN_EXPORT const troupe_env_plugin_api* troupe_env_plugin(void) {...}
 *
 * (its name does not carry the version, so that troupe can name a mismatch
 * rather than a missing symbol). The table is the plugin's, static, never
 * freed: troupe never unloads a plugin library. */
#if defined(__GNUC__)
#define TROUPE_ENV_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define TROUPE_ENV_PLUGIN_EXPORT
#endif
#define TROUPE_ENV_PLUGIN_ENTRY "troupe_env_plugin"
typedef const troupe_env_plugin_api* (*troupe_env_plugin_entry)(void);
TROUPE_ENV_PLUGIN_EXPORT const troupe_env_plugin_api* troupe_env_plugin(void);

#ifdef __cplusplus
}
#endif

#endif /* TROUPE_ENV_PLUGIN_H */
