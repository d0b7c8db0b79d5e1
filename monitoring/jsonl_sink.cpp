#include "monitoring/jsonl_sink.hpp"

namespace troupe::monitoring {

jsonl_sink::jsonl_sink(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {}

void jsonl_sink::write(const nlohmann::json& line, int64_t) {
  out_ << line.dump() << '\n';
  out_.flush();
}

}  // namespace troupe::monitoring
