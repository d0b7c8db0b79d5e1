// Timeline traces (troupe run --trace FILE): the file is Chrome trace-event
// JSON in the agreed format, every actor and device thread has its track,
// replica tracks account for the job's whole wall time, and tracing changes
// nothing a job computes.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/fault_injection.hpp"
#include "report/trace_summary.hpp"
#include "runtime/job.hpp"
#include "tests/strategy_fixtures.hpp"
#include "trace/trace.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

using env_t = test::strategy_env;

const std::set<std::string> categories{"compute", "communicate", "wait", "io"};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);  // throws (fails the test) on invalid JSON
}

struct span {
  double begin, end;
  std::string name, cat;
  nlohmann::json args;
};

// A trace checked against the format, its spans by track name.
struct checked_trace {
  nlohmann::json other;
  std::map<std::string, std::vector<span>> tracks;
  std::map<std::string, std::vector<double>> counters;  // "<counter>/<series>"
  double wall_us() const { return other["end_us"].get<double>() - other["start_us"].get<double>(); }
  bool has_span(const std::string& track, const std::string& name) const {
    auto t = tracks.find(track);
    if (t == tracks.end()) return false;
    return std::any_of(t->second.begin(), t->second.end(),
                       [&](const span& s) { return s.name == name; });
  }
};

// The schema: every event has ph/pid/tid/ts (metadata: no ts); X events a
// dur >= 0 and a cat of the four; every tid used is named; one pid; spans on
// a track nest and never partially overlap.
checked_trace check_schema(const nlohmann::json& t) {
  checked_trace out;
  REQUIRE(t.is_object());
  REQUIRE(t.contains("traceEvents"));
  REQUIRE(t["traceEvents"].is_array());
  CHECK(t["displayTimeUnit"] == "ms");
  out.other = t["otherData"];
  for (const char* k : {"troupe_version", "job", "strategy", "replicas", "start_us", "end_us"})
    CHECK_MESSAGE(out.other.contains(k), "otherData lacks ", k);
  CHECK(out.wall_us() > 0);

  std::map<int64_t, std::string> names;
  std::set<int64_t> used, pids;
  std::vector<const nlohmann::json*> xs, cs;
  for (std::size_t i = 0; i < t["traceEvents"].size(); ++i) {
    const auto& e = t["traceEvents"][i];
    CAPTURE(i);
    REQUIRE(e.contains("ph"));
    REQUIRE(e.contains("pid"));
    REQUIRE(e.contains("tid"));
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    pids.insert(e["pid"].get<int64_t>());
    const auto ph = e["ph"].get<std::string>();
    if (ph == "M") {
      if (e["name"] == "thread_name") names[e["tid"].get<int64_t>()] = e["args"]["name"];
      continue;
    }
    REQUIRE(e.contains("ts"));
    REQUIRE(e["ts"].is_number());
    CHECK(e["ts"].get<double>() >= 0);
    used.insert(e["tid"].get<int64_t>());
    if (ph == "X") {
      REQUIRE(e.contains("dur"));
      REQUIRE(e["dur"].is_number());
      CHECK(e["dur"].get<double>() >= 0);
      REQUIRE(e.contains("cat"));
      CHECK_MESSAGE(categories.count(e["cat"].get<std::string>()) == 1, "cat ", e["cat"]);
      xs.push_back(&e);
    } else {
      REQUIRE(ph == "C");
      REQUIRE(e["args"].is_object());
      REQUIRE(e["args"].size() == 1);
      cs.push_back(&e);
    }
  }
  CHECK(pids.size() == 1);
  for (auto tid : used) CHECK_MESSAGE(names.count(tid) == 1, "tid ", tid, " has no thread_name");
  for (const auto* e : xs) {
    const double ts = (*e)["ts"], dur = (*e)["dur"];
    out.tracks[names[(*e)["tid"].get<int64_t>()]].push_back(
        {ts, ts + dur, (*e)["name"], (*e)["cat"], e->value("args", nlohmann::json::object())});
  }
  for (const auto* e : cs) {
    const auto& series = names[(*e)["tid"].get<int64_t>()];
    CHECK((*e)["args"].contains(series));  // the series is named after its track
    out.counters[(*e)["name"].get<std::string>() + "/" + series].push_back(
        (*e)["args"][series].get<double>());
  }
  // Nesting: sorted by start (longer first), each span ends inside every
  // span still open at its start, with no tolerance (as troupe report checks).
  for (auto& [track, spans] : out.tracks) {
    std::sort(spans.begin(), spans.end(), [](const span& a, const span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<const span*> open;
    for (const auto& s : spans) {
      while (!open.empty() && open.back()->end <= s.begin) open.pop_back();
      if (!open.empty())
        CHECK_MESSAGE(s.end <= open.back()->end, track, ": ", s.name, " [", s.begin, ", ", s.end,
                      "] overlaps ", open.back()->name, " [", open.back()->begin, ", ",
                      open.back()->end, "] partially");
      open.push_back(&s);
    }
  }
  return out;
}

// Seconds of a track per category, innermost span's category only (a
// parent's own time is what its children do not cover). Spans sorted as
// check_schema leaves them.
std::map<std::string, double> innermost_us(const std::vector<span>& spans) {
  std::map<std::string, double> by_cat;
  std::vector<std::pair<const span*, double>> open;  // span, time its children cover
  auto close = [&] {
    auto [s, children] = open.back();
    open.pop_back();
    by_cat[s->cat] += std::max(0.0, (s->end - s->begin) - children);
    if (!open.empty()) open.back().second += s->end - s->begin;
  };
  for (const auto& s : spans) {
    while (!open.empty() && open.back().first->end <= s.begin) close();
    open.push_back({&s, 0.0});
  }
  while (!open.empty()) close();
  return by_cat;
}

// A 2-replica mirrored job long enough (~0.6 s in a release build) that the
// milliseconds before its replicas start and after they stop are a small part
// of it. How much of the job's wall time a replica track must cover is a
// figure of the machine's load (start-up and shutdown are outside the
// replicas' lives; 93% under ThreadSanitizer and CI's load), so the bound is
// a loose one that only a replica missing most of its spans fails; the exact
// property, checked in every build, is that the replica's own life is
// covered without gaps.
constexpr double kMinWallCoverage = 0.5;

job_config mirrored_job(env_t& env) {
  auto c = env.job("mirrored", "adam", 2, 64);
  c.model.hidden = {64};
  c.training.epochs = 24;
  c.training.eval_every_epochs = 8;
  c.strategy.shard_optimizer = false;
  c.strategy.reducer.bucket_bytes = 4096;  // several buckets per collective
  c.checkpoint.every_steps = 150;
  return c;
}

}  // namespace

TEST_CASE("a 2-replica mirrored trace: valid trace-event JSON, every track, replica time covered") {
  env_t env(4000);
  auto c = mirrored_job(env);
  test::temp_dir dir;
  job_options o;
  o.trace_path = dir / "trace.json";
  auto s = run_job(c, o);
  CHECK(s["trace"] == o.trace_path);
  CHECK_FALSE(trace::enabled());  // off again once the job is done

  const auto written = read_json(o.trace_path);
  auto t = check_schema(written);
  CHECK(t.other["job"] == c.name);
  CHECK(t.other["strategy"] == "mirrored");
  CHECK(t.other["replicas"] == 2);
  for (const char* track : {"replica:0", "replica:1", "device:0", "device:1", "input_pipeline:0",
                            "input_pipeline:1", "reducer:0", "reducer:1", "coordinator"})
    CHECK_MESSAGE(t.tracks.count(track) == 1, "no track ", track);

  const int64_t steps = s["steps"];
  REQUIRE(steps > 10);
  for (const char* r : {"replica:0", "replica:1"}) {
    CAPTURE(r);
    CHECK(t.has_span(r, "forward_backward_allreduce_update"));
    CHECK(t.has_span(r, "wait_for_step"));  // idle while its peer finishes
    CHECK(t.counters.count(std::string("mailbox_depth/") + r) == 1);

    auto by_cat = innermost_us(t.tracks[r]);
    double covered = 0;
    std::string shares;
    for (const auto& [cat, us] : by_cat) {
      covered += us;
      shares += cat + " " + std::to_string(us / t.wall_us()) + "; ";
    }
    CAPTURE(shares);
    double first = t.tracks[r].front().begin, last = 0;
    for (const auto& sp : t.tracks[r]) {
      first = std::min(first, sp.begin);
      last = std::max(last, sp.end);
    }
    CHECK(covered / (last - first) > 0.99);  // no gap inside the replica's life
    CHECK(covered / t.wall_us() > kMinWallCoverage);
    CHECK(covered / t.wall_us() < 1.05);
    CHECK(by_cat["compute"] > 0);
    CHECK(by_cat["wait"] > 0);
  }
  // The device thread waits for the reducers inside the step's task: that
  // wait is the step's communication.
  for (const char* d : {"device:0", "device:1"}) {
    CAPTURE(d);
    // One step task (gradients, the all-reduce through the reducers, the
    // update: strategies/mirrored_step.cpp) per step, with its step number.
    // (On the replica's track two steps in a row may be one state.)
    std::set<int64_t> steps_of;
    for (const auto& sp : t.tracks[d])
      if (sp.name == "forward_backward_allreduce_update" && sp.args.contains("step"))
        steps_of.insert(sp.args["step"].get<int64_t>());
    REQUIRE(steps_of.size() == static_cast<std::size_t>(steps));
    CHECK(*steps_of.begin() == 0);
    CHECK(*steps_of.rbegin() == steps - 1);
    double communicate = 0;
    for (const auto& sp : t.tracks[d])
      if (sp.cat == "communicate") communicate += sp.end - sp.begin;
    CHECK(communicate > 0);
  }
  CHECK(t.has_span("coordinator", "checkpoint_write"));
  CHECK(t.has_span("coordinator", "write_metrics"));
  CHECK(t.has_span("device:0", "evaluate"));
  CHECK(t.counters.count("queue_depth/input_pipeline:0") == 1);

  // Every step's gradients in several collectives (the step issues each
  // layer's as backward makes them, in buckets of bucket_bytes), each bucket
  // span labelled with its step and bucket, over the reducer's track and its
  // lanes; as many in the last step as in the first.
  std::map<int64_t, int64_t> buckets_of_step;
  for (const auto& [track, spans] : t.tracks) {
    if (track.rfind("reducer:0", 0) != 0) continue;
    for (const auto& sp : spans)
      if (sp.name == "all_reduce_bucket") {
        REQUIRE(sp.args.contains("step"));
        REQUIRE(sp.args.contains("bucket"));
        CHECK(sp.cat == "communicate");
        ++buckets_of_step[sp.args["step"].get<int64_t>()];
      }
  }
  CHECK(buckets_of_step.size() == static_cast<std::size_t>(steps));
  CHECK(buckets_of_step[0] > 1);
  CHECK(buckets_of_step[0] == buckets_of_step[steps - 1]);

  // What troupe report makes of the same file agrees: nothing to clip, each
  // replica's four shares add up to the wall time, a real all-reduce share.
  auto summary = report::summarize_trace(written);
  CHECK(summary.clipped_spans == 0);
  CHECK(summary.wall_s == doctest::Approx(t.wall_us() / 1e6));
  int replicas_seen = 0;
  for (const auto& tr : summary.tracks) {
    if (tr.track.rfind("replica:", 0) != 0) continue;
    ++replicas_seen;
    CAPTURE(tr.track);
    const double covered = tr.compute_s + tr.communicate_s + tr.wait_s + tr.io_s;
    CHECK(covered / summary.wall_s > kMinWallCoverage);
    CHECK(covered / summary.wall_s < 1.05);
  }
  CHECK(replicas_seen == 2);
  CHECK(summary.allreduce_share > 0);
  CHECK(summary.allreduce_share < 1);
}

TEST_CASE("mirrored on the device collectives: the collectives show inside the step's task") {
  env_t env(1000);
  auto c = env.job("mirrored", "adam", 2, 64);
  c.model.hidden = {64};
  c.training.epochs = 4;
  c.strategy.reducer.algorithm = reducer_algorithm::device;  // on cpu:0 and cpu:1: the host group
  test::temp_dir dir;
  job_options o;
  o.trace_path = dir / "device_collectives.json";
  run_job(c, o);
  const auto written = read_json(o.trace_path);
  auto t = check_schema(written);
  CHECK(t.tracks.count("reducer:0") == 0);  // no reducer actors in this protocol
  for (const char* d : {"device:0", "device:1"}) {
    CAPTURE(d);
    CHECK(t.has_span(d, "forward_backward_allreduce_update"));
    // Each rank's share of ZeRO-1's reduce-scatter and all-gather, as
    // communication.
    std::set<std::string> communicate;
    for (const auto& sp : t.tracks[d])
      if (sp.cat == "communicate") communicate.insert(sp.name);
    CHECK(communicate.count("reduce_scatter") == 1);
    CHECK(communicate.count("all_gather") == 1);
  }
  // So troupe report gives these jobs a real all-reduce share, not 0.
  auto summary = report::summarize_trace(written);
  CHECK(summary.clipped_spans == 0);
  CHECK(summary.allreduce_share > 0);
  CHECK(summary.allreduce_share < 1);
}

TEST_CASE("a parameter_server trace has pull and push spans on workers and shards") {
  env_t env(1000);
  auto c = env.job("parameter_server", "sgd", 2, 32);
  c.strategy.shards = 2;
  c.training.epochs = 1;
  test::temp_dir dir;
  job_options o;
  o.trace_path = dir / "ps.json";
  run_job(c, o);
  auto t = check_schema(read_json(o.trace_path));
  CHECK(t.other["strategy"] == "parameter_server");
  for (const char* track : {"replica:0", "replica:1", "variable_shard:0", "variable_shard:1"}) {
    CAPTURE(track);
    CHECK(t.has_span(track, "pull"));
    CHECK(t.has_span(track, "push"));
  }
  CHECK(t.has_span("variable_shard:0", "optimizer_update"));
  CHECK(t.has_span("replica:0", "forward_backward"));
}

TEST_CASE("tracing changes nothing a job computes, and writes nothing when not asked") {
  env_t env(1000);
  auto c = mirrored_job(env);
  c.training.epochs = 2;
  auto plain = run_job(c);
  CHECK_FALSE(plain.contains("trace"));
  for (const auto& f : fs::recursive_directory_iterator(plain["output_dir"].get<std::string>()))
    CHECK_MESSAGE(f.path().filename() != "trace.json", "unexpected ", f.path());

  test::temp_dir dir;
  job_options o;
  o.trace_path = dir / "trace.json";
  c.logging.output_dir = dir / "traced";
  auto traced = run_job(c, o);
  CHECK(fs::exists(o.trace_path));
  CHECK(traced["steps"] == plain["steps"]);
  CHECK(traced["test_loss"] == plain["test_loss"]);
  CHECK(test::max_abs_diff(test::variables_of(plain), test::variables_of(traced)) == 0.0);
}

TEST_CASE("a trace file that cannot be written fails the job before it trains") {
  env_t env(500);
  auto c = env.job("mirrored", "sgd", 2, 32);
  test::temp_dir dir;
  job_options o;
  o.trace_path = dir / "no/such/dir/trace.json";
  c.logging.output_dir = dir / "out";
  const std::string expected = "cannot write trace file '" + o.trace_path + "'";
  CHECK_THROWS_WITH_AS(run_job(c, o), doctest::Contains(expected.c_str()), job_error);
  CHECK_FALSE(fs::exists(dir / "out/metrics.jsonl"));
  CHECK_FALSE(trace::enabled());
}

// Issue 40: a trace file under a predictable name in a shared directory was
// opened following symbolic links, so another user could have a job write
// (and truncate) any file its user may write.
TEST_CASE("a trace file at a planted symbolic link is refused, naming the path; nothing written") {
  env_t env(500);
  auto c = env.job("mirrored", "sgd", 2, 32);
  test::temp_dir dir;
  const std::string victim = dir / "victim.txt";
  std::ofstream(victim) << "keep me";
  job_options o;
  o.trace_path = dir / "trace.json";
  fs::create_symlink(victim, o.trace_path);
  c.logging.output_dir = dir / "out";
  const std::string expected = "cannot write trace file '" + o.trace_path +
                               "': is a symbolic link; refusing to write through it";
  CHECK_THROWS_WITH_AS(run_job(c, o), doctest::Contains(expected.c_str()), job_error);
  std::string left;
  std::getline(std::ifstream(victim), left);
  CHECK(left == "keep me");
  CHECK(fs::is_symlink(o.trace_path));
  CHECK_FALSE(fs::exists(dir / "out/metrics.jsonl"));
  CHECK_FALSE(trace::enabled());
  // A regular file there from an earlier run is replaced as before.
  fs::remove(o.trace_path);
  std::ofstream(o.trace_path) << "an earlier trace";
  run_job(c, o);
  CHECK(check_schema(read_json(o.trace_path))
            .has_span("replica:0", "forward_backward_allreduce_update"));
}

TEST_CASE("a failing job's trace is still written") {
  env_t env(500);
  auto c = env.job("mirrored", "sgd", 2, 32);
  test::temp_dir dir;
  job_options o;
  o.trace_path = dir / "trace.json";
  o.faults = inject_faults(fault_injection{}.fail_replica_at(1, 3));
  CHECK_THROWS_AS(run_job(c, o), job_error);
  auto t = check_schema(read_json(o.trace_path));
  CHECK(t.has_span("replica:0", "forward_backward_allreduce_update"));
  CHECK(t.has_span("device:1", "forward_backward_allreduce_update"));
}
