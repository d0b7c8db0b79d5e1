#include "monitoring/metrics_sink.hpp"

namespace troupe::monitoring {

void metrics_fanout::add(std::shared_ptr<metrics_sink> sink) {
  if (sink) sinks_.push_back(std::move(sink));
}

void metrics_fanout::write(const nlohmann::json& line, int64_t step) {
  for (auto& s : sinks_) s->write(line, step);
}

}  // namespace troupe::monitoring
