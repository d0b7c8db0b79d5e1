#pragma once
// What the monitoring sinks read from a metrics line: its type, whose line
// it is (a shard, a worker, an rl_actor, or the job's own), its step and its
// numeric fields. One rule for every line, so a field a strategy adds to its
// lines reaches TensorBoard and /metrics without code here.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::monitoring {

struct line_scalars {
  std::string type;  // the line's "type": "step", "epoch", "train", "shard", "push", ...
  // Whose line it is: {"shard", 2} for a line with "shard": 2 (likewise
  // "worker", "actor"); empty role_key for the job's own lines.
  std::string role_key;
  int64_t role_index = -1;
  int64_t step = 0;  // the line's "step", else the job's step when written
  // Every number of the line but type, step and the role, in key order.
  std::vector<std::pair<std::string, double>> fields;
};

// Nothing for a line without a string "type", and for the summary (one
// nested object at the end, not a time series).
std::optional<line_scalars> scalars_of(const nlohmann::json& line, int64_t step_now);

}  // namespace troupe::monitoring
