#include "cli/report.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "monitoring/output_file.hpp"
#include "report/html_report.hpp"

namespace troupe::report {

int cmd_report(const std::vector<std::string>& args,
               const std::function<int(const std::string&)>& bad_usage) {
  std::string out = "report.html";
  std::vector<std::string> dirs, trace_files;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "-o" || a == "--output" || a == "--trace") {
      if (i + 1 >= args.size()) return bad_usage("report: " + a + " needs a file");
      (a == "--trace" ? trace_files.emplace_back(args[++i]) : out = args[++i]);
    } else if (a.starts_with("-")) {
      return bad_usage("report: unknown option '" + a + "'");
    } else {
      dirs.push_back(a);
    }
  }
  if (dirs.empty() && trace_files.empty())
    return bad_usage("report: give one or more run directories (or --trace FILE)");
  std::string html;
  try {
    std::vector<run_data> runs;
    for (const auto& d : dirs) runs.push_back(load_run(d));
    std::vector<named_trace> traces;
    for (const auto& t : trace_files) traces.push_back({t, load_trace(t)});
    html = render_html(runs, traces);
  } catch (const report_error& e) {
    std::cerr << "troupe: report: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    // A metrics value of an unexpected type (a string where a number goes).
    std::cerr << "troupe: report: unexpected content in the input: " << e.what() << "\n";
    return 2;
  }
  // Written beside the target and renamed: a failed write leaves no half
  // page, and a link planted at either name is never written through.
  try {
    monitoring::replace_file_atomically(out, out + ".tmp", html);
  } catch (const monitoring::output_file_error& e) {
    std::cerr << "troupe: report: cannot write " << e.what() << "\n";
    return 2;
  }
  std::cout << "report: " << out << " (" << dirs.size() << " run" << (dirs.size() == 1 ? "" : "s")
            << (trace_files.empty() ? "" : ", " + std::to_string(trace_files.size()) + " trace(s)")
            << ")\n";
  return 0;
}

}  // namespace troupe::report
