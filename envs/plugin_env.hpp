#pragma once
// Native environment plugins (rl.env {"kind": "plugin"}): a shared library
// exporting troupe's C ABI (envs/troupe_env_plugin.h) stepped in-process as
// a vector_env, so rl_actors and learners take it as they take a built-in
// environment. A library is loaded once per process (dlopen, RTLD_LOCAL:
// its symbols clash with no other library's) and never unloaded.
#include <memory>
#include <string>

#include "config/job_config.hpp"
#include "envs/env.hpp"

namespace troupe::envs {

// The path dlopen gets for rl.env.library: an absolute one as written; a
// relative one in the build's plugin directory (TROUPE_PLUGIN_DIR) when it
// is there, else as written (relative to the working directory with a '/',
// else the dynamic linker's search path). load_job_config has already made
// a library found next to the config file absolute.
std::string plugin_library_path(const std::string& library);

// Throws env_start_error (envs/python_env.hpp) naming the key at fault: the
// library that does not load (with dlerror's text), exports no
// troupe_env_plugin or another ABI version (rl.env.library); the id or
// kwargs the plugin's create() refuses, or spaces no policy head or model
// takes (rl.env). A step the plugin fails throws std::runtime_error with
// the plugin's own message.
std::unique_ptr<vector_env> make_plugin_env(const plugin_env_config& p, int64_t instances);

}  // namespace troupe::envs
