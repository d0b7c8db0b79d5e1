#pragma once
// The "cluster" section of the schema (config/schema.cpp reads it through
// this): its keys, their checks and their effective JSON. The rules that
// involve other sections (a chief, placement against the strategy) are
// check_cluster's (config/cluster.hpp).
#include <string>

#include <nlohmann/json.hpp>

#include "config/cluster.hpp"

namespace troupe {

// Reads the "cluster" object at `path` into `c`; a bad value throws
// config_error naming its path.
void read_cluster(const nlohmann::json& j, const std::string& path, cluster_spec& c);

// The effective "cluster" (what `troupe validate` prints).
nlohmann::json cluster_to_json(const cluster_spec& k);

// A device name: cpu:N, cuda:N or sim:N (a CPU device standing in for an
// accelerator, in tests), N without leading zeros.
bool valid_device(const std::string& s);

}  // namespace troupe
