#pragma once
// What spdlog's default logger writes while a captured_log lives (at
// `level` when given; the level before is restored after).
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::test {

struct captured_log {
  std::shared_ptr<std::ostringstream> out = std::make_shared<std::ostringstream>();
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  spdlog::level::level_enum previous_level = spdlog::get_level();
  std::shared_ptr<spdlog::logger> mine;
  explicit captured_log(std::optional<spdlog::level::level_enum> level = {}) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*out);
    mine = std::make_shared<spdlog::logger>("captured", sink);
    spdlog::set_default_logger(mine);
    spdlog::set_level(level.value_or(previous_level));
  }
  // The logger and its stream outlive this: spdlog::warn and the like use
  // the default logger's raw pointer, so a thread a test leaves behind (a
  // link's pump saying it closed) may still write to it as it is replaced.
  ~captured_log() {
    spdlog::set_default_logger(previous);
    spdlog::set_level(previous_level);
    static std::mutex mutex;
    static std::vector<std::shared_ptr<const void>> retired;
    std::lock_guard<std::mutex> guard(mutex);
    retired.push_back(std::move(mine));
    retired.push_back(std::move(out));
  }
  captured_log(const captured_log&) = delete;
  captured_log& operator=(const captured_log&) = delete;
  std::string text() const {
    spdlog::default_logger()->flush();
    return out->str();
  }
};

// Every log line of a test program, also on stderr, kept in a ring that is
// safe to read while other threads log (TSan). Installed once, as a global,
// before any thread starts.
struct ring_log {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096);
  ring_log() {
    auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    spdlog::set_default_logger(
        std::make_shared<spdlog::logger>("troupe", spdlog::sinks_init_list{console, ring}));
  }
  bool contains(const std::string& text) const {
    for (const auto& line : ring->last_formatted())
      if (line.find(text) != std::string::npos) return true;
    return false;
  }
};

}  // namespace troupe::test
