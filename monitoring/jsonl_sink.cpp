#include "monitoring/jsonl_sink.hpp"

#include <spdlog/spdlog.h>

namespace troupe::monitoring {

jsonl_sink::jsonl_sink(const std::string& path, bool append) {
  try {
    out_ = output_file(path, append ? output_file::mode::append : output_file::mode::replace);
  } catch (const output_file_error& e) {
    // Made inside the coordinator: its lines are dropped, the job goes on.
    spdlog::error("metrics: {}; the metrics lines are not written", e.what());
  }
}

void jsonl_sink::write(const nlohmann::json& line, int64_t) {
  out_.write(line.dump() + '\n');
}

}  // namespace troupe::monitoring
