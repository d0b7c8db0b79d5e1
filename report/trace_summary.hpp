// Where each track of a timeline trace spent the job's wall time: computing,
// communicating, waiting, writing, or in nothing the trace marked.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe::report {

struct track_summary {
  std::string track;  // its thread_name, else "pid:tid"
  int64_t pid = 0, tid = 0;
  double compute_s = 0, communicate_s = 0, wait_s = 0, io_s = 0;
  double untraced_s = 0;  // wall - the four above, clipped at 0
  double wall_s = 0;
};

struct trace_summary {
  double wall_s = 0;                  // otherData end_us - start_us, else the events' extent
  std::vector<track_summary> tracks;  // tracks with spans, in first-seen order
  // communicate / (compute + communicate) over the replica:* and device:*
  // tracks: the all-reduce share of step time; NaN without replica compute.
  double allreduce_share = 0;
  int64_t clipped_spans = 0;  // spans that partially overlapped their parent
};

// Spans nest; time under a nested span counts for the innermost span's
// category only. Throws std::runtime_error naming the event's index and
// field when the trace is malformed ("traceEvents[12].dur: expected a
// number >= 0").
trace_summary summarize_trace(const nlohmann::json& trace);

}  // namespace troupe::report
