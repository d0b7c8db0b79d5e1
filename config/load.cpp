// Reading a job config file: I/O and JSON syntax errors become config_errors
// that name the file (and the line and column of a syntax error).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "config/job_config.hpp"
#include "config/json_limits.hpp"
#include "config/strategy_rules.hpp"

namespace troupe {
namespace {

// nlohmann's detail reads "syntax error while parsing object - unexpected ','; expected ..."
// after a "[json.exception...] parse error at line L, column C: " prefix; keep the detail
// and say where it happened last.
std::string syntax_detail(const nlohmann::json::parse_error& e) {
  std::string what = e.what();
  std::size_t bracket = what.find(']');
  std::size_t colon = what.find(": ", bracket == std::string::npos ? 0 : bracket);
  std::string detail = colon == std::string::npos ? what : what.substr(colon + 2);
  const std::string lead = "syntax error while parsing ";
  if (detail.starts_with(lead)) {
    std::size_t dash = detail.find(" - ", lead.size());
    if (dash != std::string::npos)
      detail = detail.substr(dash + 3) + " (while parsing " +
               detail.substr(lead.size(), dash - lead.size()) + ")";
  }
  return detail;
}

// rl.env.library of a {"kind": "plugin"} env, when relative and found next to
// the config file, becomes that file's absolute path: the config then means
// the same library from any working directory, and in the other processes
// of the job, which read it from the chief (to_json). Anything else is left
// for the loader (envs/plugin_env.hpp) and for validation to name.
void resolve_plugin_library(nlohmann::json& j, const std::string& file) {
  if (!j.is_object() || !j.contains("rl") || !j["rl"].is_object()) return;
  auto& env = j["rl"];
  if (!env.contains("env") || !env["env"].is_object()) return;
  auto& e = env["env"];
  if (e.value("kind", nlohmann::json()) != "plugin" || !e.contains("library") ||
      !e["library"].is_string())
    return;
  const std::filesystem::path library = e["library"].get<std::string>();
  if (library.empty() || library.is_absolute()) return;
  std::error_code ec;
  const auto beside =
      std::filesystem::absolute(std::filesystem::path(file).parent_path() / library, ec);
  if (!ec && std::filesystem::is_regular_file(beside, ec))
    e["library"] = beside.lexically_normal().string();
}

}  // namespace

job_config parse_saved_job_config(nlohmann::json j) {
  auto s = j.find("strategy");
  if (j.is_object() && s != j.end() && s->is_object()) {
    auto kind = s->find("kind");
    auto rules =
        find_strategy_rules(kind != s->end() && kind->is_string() ? kind->get<std::string>()
                                                                  : job_config{}.strategy.kind);
    if (rules) {
      std::vector<std::string> own;
      for (const auto& k : rules->keys()) own.push_back(k.name);
      std::vector<std::string> foreign;
      for (const auto& [key, value] : s->items())
        if (std::find(own.begin(), own.end(), key) == own.end() &&
            !strategies_with_key(key).empty())
          foreign.push_back(key);
      for (const auto& key : foreign) s->erase(key);
    }
  }
  return parse_job_config(j);
}

job_config load_job_config(const std::string& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    throw config_error("", "cannot open config file '" + file + "': " + std::strerror(EISDIR));
  errno = 0;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    int err = errno ? errno : ENOENT;
    throw config_error("", "cannot open config file '" + file + "': " + std::strerror(err));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw config_error("", "cannot read config file '" + file + "'");
  return parse_job_config_text(buf.str(), file);
}

job_config parse_job_config_text(const std::string& text, const std::string& file) {
  // Refused before parsing: nothing recursive ever sees a deep document.
  if (json_nesting_depth(text, /*comments=*/true) > kMaxJsonDepth)
    throw config_error("", file + ": JSON nested too deeply (more than " +
                               std::to_string(kMaxJsonDepth) +
                               " levels of [ and {); a job config needs fewer than 10");
  nlohmann::json j;
  try {
    // Comments (// and /* */) are allowed in config files.
    j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the 1-based index of the offending character (size + 1 at end of input).
    std::size_t at = e.byte == 0 ? 0 : std::min<std::size_t>(e.byte - 1, text.size());
    std::size_t line =
        1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + at, '\n'));
    std::size_t line_start = text.rfind('\n', at == 0 ? std::string::npos : at - 1);
    line_start = (at == 0 || line_start == std::string::npos) ? 0 : line_start + 1;
    std::size_t column = at - line_start + 1;
    throw config_error("", file + ": JSON syntax error at line " + std::to_string(line) +
                               ", column " + std::to_string(column) + ": " + syntax_detail(e));
  } catch (const nlohmann::json::out_of_range& e) {
    // A number beyond a double's range (1e309): nlohmann gives no position.
    std::string what = e.what();
    std::size_t bracket = what.find("] ");
    throw config_error("", file + ": JSON " +
                               (bracket == std::string::npos ? what : what.substr(bracket + 2)) +
                               " (numbers must fit a double)");
  }
  resolve_plugin_library(j, file);
  return parse_job_config(j);
}

}  // namespace troupe
