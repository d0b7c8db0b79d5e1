#pragma once
// metrics.jsonl: one JSON object per line, flushed at once (a crashed job
// keeps every line it wrote; `troupe report` and tests read it). Never
// written through a symbolic link or a hard link (monitoring/output_file.hpp).
#include <string>

#include "monitoring/metrics_sink.hpp"
#include "monitoring/output_file.hpp"

namespace troupe::monitoring {

class jsonl_sink final : public metrics_sink {
 public:
  // append: a resumed job adds to the file; otherwise it starts afresh.
  jsonl_sink(const std::string& path, bool append);
  void write(const nlohmann::json& line, int64_t step) override;

 private:
  output_file out_;
};

}  // namespace troupe::monitoring
