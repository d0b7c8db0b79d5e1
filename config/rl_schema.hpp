#pragma once
// rl's part of the schema (config/schema.cpp reads a job's "rl" through it):
// its keys, their checks and their effective JSON.
#include <string>

#include <nlohmann/json.hpp>

#include "config/job_config.hpp"

namespace troupe {

// Reads the "rl" object at `path` into `c`; a bad value throws config_error
// naming its path ("rl.actors: expected an integer >= 1, got 0").
void read_rl(const nlohmann::json& j, const std::string& path, rl_config& c);

// The effective "rl" (what `troupe validate` prints).
nlohmann::json rl_to_json(const rl_config& rl);

}  // namespace troupe
