// `troupe report RUN_DIR... [-o FILE.html] [--trace TRACE.json]...`
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace troupe::report {

// Writes the report (default report.html); exit status 0, or 2 on bad usage
// or bad input (the message names the file and place; nothing is written).
int cmd_report(const std::vector<std::string>& args,
               const std::function<int(const std::string&)>& bad_usage);

}  // namespace troupe::report
