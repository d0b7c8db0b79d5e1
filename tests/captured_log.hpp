#pragma once
// What spdlog's default logger writes while a captured_log lives (at
// `level` when given; the level before is restored after).
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <sstream>
#include <string>

namespace troupe::test {

struct captured_log {
  std::shared_ptr<std::ostringstream> out = std::make_shared<std::ostringstream>();
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  spdlog::level::level_enum previous_level = spdlog::get_level();
  explicit captured_log(std::optional<spdlog::level::level_enum> level = {}) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*out);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
    spdlog::set_level(level.value_or(previous_level));
  }
  ~captured_log() {
    spdlog::set_default_logger(previous);
    spdlog::set_level(previous_level);
  }
  captured_log(const captured_log&) = delete;
  captured_log& operator=(const captured_log&) = delete;
  std::string text() const {
    spdlog::default_logger()->flush();
    return out->str();
  }
};

}  // namespace troupe::test
