#pragma once
// rl.population's part of the schema (config/schema.cpp reads rl through
// it): the population's keys, their checks and their effective JSON.
#include <string>

#include <nlohmann/json.hpp>

#include "config/job_config.hpp"

namespace troupe {

// Reads rl.population into `c`; a bad value throws config_error naming its
// path ("rl.population.size: expected an integer >= 2, got 1").
void read_population(const nlohmann::json& j, const std::string& path, population_config& c);

// The effective rl.population (what `troupe validate` prints).
nlohmann::json population_to_json(const population_config& c);

}  // namespace troupe
