#include "monitoring/metrics_line.hpp"

#include <array>

namespace troupe::monitoring {
namespace {

constexpr std::array<const char*, 3> kRoleKeys = {"shard", "worker", "actor"};

bool is_role_key(const std::string& key) {
  for (const char* k : kRoleKeys)
    if (key == k) return true;
  return false;
}

}  // namespace

std::optional<line_scalars> scalars_of(const nlohmann::json& line, int64_t step_now) {
  if (!line.is_object()) return std::nullopt;
  auto type = line.find("type");
  if (type == line.end() || !type->is_string() || *type == "summary") return std::nullopt;
  line_scalars s;
  s.type = type->get<std::string>();
  s.step = step_now;
  if (auto step = line.find("step"); step != line.end() && step->is_number_integer())
    s.step = step->get<int64_t>();
  for (const char* k : kRoleKeys)
    if (auto r = line.find(k); r != line.end() && r->is_number_integer()) {
      s.role_key = k;
      s.role_index = r->get<int64_t>();
      break;
    }
  for (const auto& [key, value] : line.items()) {
    if (!value.is_number() || key == "step" || is_role_key(key)) continue;
    s.fields.emplace_back(key, value.get<double>());
  }
  return s;
}

}  // namespace troupe::monitoring
