#include "monitoring/prometheus_sink.hpp"

#include <array>
#include <string_view>

#include "monitoring/metrics_line.hpp"

namespace troupe::monitoring {
namespace {

// Fields that are running totals of the job (they only grow): counters.
constexpr std::array<std::string_view, 9> kTotals = {
    "env_steps", "episodes",  "pushes",
    "pulls",     "applies",   "rejected",
    "bytes_in",  "bytes_out", "unrolls_dropped_stale"};

bool is_total(const std::string& field) {
  for (auto t : kTotals)
    if (field == t) return true;
  return false;
}

struct known_field {
  std::string_view name, help;
};

// What the common fields mean; any other field is described by its line.
constexpr std::array<known_field, 16> kHelp = {{
    {"loss", "mean training loss over the updates since the last metrics line"},
    {"lr", "learning rate at the latest update"},
    {"samples_per_second", "training samples per second since the last metrics line"},
    {"elapsed_seconds", "seconds since the job started"},
    {"epoch", "epoch (counted from 0)"},
    {"train_loss", "mean training loss of the epoch"},
    {"train_accuracy", "training accuracy of the epoch"},
    {"test_accuracy", "accuracy on the test set"},
    {"test_loss", "loss on the test set"},
    {"staleness_mean", "mean staleness of the pushes a shard applied (versions behind)"},
    {"staleness_max", "largest staleness of the pushes a shard applied"},
    {"mean_return_100", "mean return of the last 100 episodes"},
    {"policy_lag_mean", "mean policy lag of the unrolls learned from (versions behind)"},
    {"policy_lag_max", "largest policy lag of the unrolls learned from"},
    {"queue_depth", "unrolls waiting in the trajectory queue"},
    {"actors_live", "rl_actors alive"},
}};

std::string help_of(const std::string& type, const std::string& field) {
  for (const auto& k : kHelp)
    if (field == k.name) return std::string(k.help) + " (metrics.jsonl \"" + type + "\" lines)";
  return "\"" + field + "\" of the job's \"" + type + "\" metrics lines (metrics.jsonl)";
}

}  // namespace

prometheus_sink::prometheus_sink(std::shared_ptr<prometheus_registry> registry)
    : registry_(std::move(registry)) {}

void prometheus_sink::write(const nlohmann::json& line, int64_t step) {
  auto s = scalars_of(line, step);
  if (!s) return;
  auto& r = *registry_;
  r.add("troupe_metrics_lines_total", "metrics lines the job wrote, by type", {{"type", s->type}},
        1);
  r.set("troupe_step", metric_kind::gauge, "the job's completed updates (steps)", {},
        static_cast<double>(s->step));
  metric_labels labels;
  if (!s->role_key.empty()) labels.emplace_back(s->role_key, std::to_string(s->role_index));
  for (const auto& [field, value] : s->fields) {
    const std::string name = "troupe_" + s->type + "_" + field;
    if (is_total(field))
      r.set(name + "_total", metric_kind::counter, help_of(s->type, field), labels, value);
    else
      r.set(name, metric_kind::gauge, help_of(s->type, field), labels, value);
  }
}

}  // namespace troupe::monitoring
