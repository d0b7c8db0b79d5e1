// SIGINT (Ctrl-C) and SIGTERM to `troupe run`, `troupe node` and `troupe
// launch` at every phase (runtime/stop_policy.hpp's table): the exit status,
// the time from the signal to the exit, the checkpoint there or not, the
// summary's stop_reason, and a resume where a checkpoint is kept. troupe runs
// as a child process; TROUPE_TEST_HOLD holds it in the phase under test.
#include <doctest/doctest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "runtime/preemption.hpp"
#include "runtime/test_hooks.hpp"
#include "tests/free_port.hpp"
#include "tests/processes.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
using namespace troupe::test;
namespace fs = std::filesystem;

namespace {

// Outside training a signal must end the process well within this; only a
// hang guard (runtime/stop_policy.hpp exits within ~20 ms of the signal).
constexpr double kPromptSeconds = 5;
// The jobs signalled while training: 125 steps an epoch, a checkpoint every
// 50; the signal comes at step 5 or 50, long before the end.
constexpr int64_t kTrainingEpochs = 16;
constexpr int64_t kTrainingSteps = kTrainingEpochs * 125;

struct stopped {
  int rc = -1;
  double seconds = 0;  // from the signal to the exit
  std::string log;
};

// Once `p`'s log shows `ready`, sends `sig` (and then `again`, when given,
// once the log shows `again_after`); waits for the exit.
stopped stop_when(node_proc& p, const std::string& ready, int sig, int again = 0,
                  const std::string& again_after = {}) {
  REQUIRE_MESSAGE(file_shows(p.log, ready), "no '" << ready << "' in:\n" << p.output());
  REQUIRE_MESSAGE(p.running(), p.output());
  ::kill(p.pid, sig);
  auto sent = clock_type::now();
  if (again) {
    REQUIRE_MESSAGE(file_shows(p.log, again_after), p.output());
    ::kill(p.pid, again);
    sent = clock_type::now();
  }
  stopped s;
  s.rc = p.wait(std::chrono::seconds(60));
  s.seconds = std::chrono::duration<double>(clock_type::now() - sent).count();
  s.log = p.output();
  MESSAGE(p.task << ": exit status " << s.rc << ", " << s.seconds << " s after the signal");
  return s;
}

// A one-process job of `epochs` epochs of 125 steps, a checkpoint every 50,
// in dir/out; its config file.
std::string run_config(strategy_env& env, const temp_dir& dir, int64_t epochs) {
  auto c = env.job("", "adam", 1, 16);
  c.training.epochs = epochs;
  c.checkpoint.every_steps = 50;
  c.checkpoint.keep = 3;
  c.logging.output_dir = dir / "out";
  const std::string file = dir / "job.json";
  std::ofstream(file) << to_json(c).dump(2);
  return file;
}

std::unique_ptr<node_proc> troupe_run(const std::string& file, const temp_dir& dir,
                                      const std::string& name, std::vector<std::string> extra = {},
                                      const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> args{TROUPE_BIN, "run", file};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<node_proc>(name, dir / (name + ".log"), kSecret, args, env);
}

bool has_checkpoint(const temp_dir& dir) {
  return checkpoint::resolve(dir / "out/checkpoints").has_value();
}

nlohmann::json summary_of(const temp_dir& dir) {
  return nlohmann::json::parse(read_file(dir / "out/summary.json"));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A run stopped during training: status 75, a checkpoint at the step it
// stopped (the marker names it), the summary says why; `resume` (the same
// command, or with --resume) trains from there to the end.
void check_resumable_stop(const stopped& s, const temp_dir& dir, const std::string& signal,
                          const std::string& file, std::vector<std::string> resume) {
  CHECK_MESSAGE(s.rc == preemption::kResumeExitStatus, s.log);
  CHECK(s.seconds < kPromptSeconds);  // an update of this tiny job, and a checkpoint
  CHECK(contains(s.log, signal + " during training: stopping at the next update"));
  const auto summary = summary_of(dir);
  CHECK(summary["stop_reason"] == "preempted by " + signal);
  const int64_t stopped_at = summary["steps"];
  REQUIRE(fs::exists(dir / "out/checkpoints/preempted.json"));
  auto latest = checkpoint::resolve(dir / "out/checkpoints");
  REQUIRE(latest);
  CHECK(checkpoint::load(*latest).meta.step == stopped_at);
  auto again = troupe_run(file, dir, "resumed", resume);
  REQUIRE_MESSAGE(again->wait(std::chrono::seconds(120)) == 0, again->output());
  const auto end = summary_of(dir);
  CHECK(end["steps"] == kTrainingSteps);
  CHECK(end["steps_this_run"] == kTrainingSteps - stopped_at);
  CHECK_FALSE(end.contains("stop_reason"));
  CHECK_FALSE(fs::exists(dir / "out/checkpoints/preempted.json"));
}

}  // namespace

TEST_CASE("the environment's test hooks are read into fault_injection, each one checked") {
  const char* names[] = {"TROUPE_TEST_FAIL_REPLICA", "TROUPE_TEST_HOLD_SHARD_AT_EXIT",
                         "TROUPE_TEST_GATE_FAILS_AFTER_S", "TROUPE_TEST_HOLD"};
  for (const char* n : names) ::unsetenv(n);
  CHECK(faults_from_environment(nullptr) == nullptr);  // none named: none made
  ::setenv("TROUPE_TEST_FAIL_REPLICA", "1:27", 1);
  ::setenv("TROUPE_TEST_HOLD", "checkpoint:2.5", 1);
  auto given = inject_faults(fault_injection{}.fail_shard_at(0, 3));
  auto f = faults_from_environment(given);
  REQUIRE(f != nullptr);
  CHECK(f->fail_replica.at_for(1) == 27);
  CHECK(f->fail_shard.at_for(0) == 3);  // what the caller gave is kept
  CHECK(f->hold.point == "checkpoint");
  CHECK(f->hold.seconds == 2.5);
  CHECK_FALSE(f->hold_shard_at_exit);
  // Malformed values are ignored (and logged), never half-applied.
  ::setenv("TROUPE_TEST_FAIL_REPLICA", "one", 1);
  ::setenv("TROUPE_TEST_HOLD", "checkpoint", 1);
  f = faults_from_environment(nullptr);
  REQUIRE(f != nullptr);
  CHECK(f->fail_replica.at_for(0) == -1);
  CHECK(f->hold.point.empty());
  for (const char* n : names) ::unsetenv(n);
}

TEST_CASE(
    "troupe run, SIGTERM during training: a checkpoint at the next update, exit 75, the "
    "same command resumes") {
  strategy_env env(2000);
  temp_dir dir;
  const auto file = run_config(env, dir, kTrainingEpochs);
  auto p = troupe_run(file, dir, "run");
  auto s = stop_when(*p, "step 5", SIGTERM);  // the first progress line: it trains
  check_resumable_stop(s, dir, "SIGTERM", file, {});
}

TEST_CASE("troupe run, Ctrl-C (SIGINT) during training: as SIGTERM, and --resume continues") {
  strategy_env env(2000);
  temp_dir dir;
  const auto file = run_config(env, dir, kTrainingEpochs);
  auto p = troupe_run(file, dir, "run");
  auto s = stop_when(*p, "step 5", SIGINT);
  check_resumable_stop(s, dir, "SIGINT", file, {"--resume"});
}

TEST_CASE(
    "troupe run, SIGTERM while a checkpoint is written: the write completes, the job "
    "stops at that step with 75") {
  strategy_env env(2000);
  temp_dir dir;
  const auto file = run_config(env, dir, kTrainingEpochs);
  auto p = troupe_run(file, dir, "run", {}, {{"TROUPE_TEST_HOLD", "checkpoint:1"}});
  auto s = stop_when(*p, "holding at checkpoint", SIGTERM);
  CHECK(s.seconds < kPromptSeconds);
  // The checkpoint it was writing is complete (the stop comes at the update
  // after it: steps in flight finish first).
  CHECK(checkpoint::load(dir / "out/checkpoints/ckpt-0000000050").meta.step == 50);
  CHECK(summary_of(dir)["steps"] >= 50);
  check_resumable_stop(s, dir, "SIGTERM", file, {"--resume"});
}

TEST_CASE(
    "troupe run, a second Ctrl-C while training stops: exit 130 at once, no new "
    "checkpoint") {
  strategy_env env(2000);
  temp_dir dir;
  const auto file = run_config(env, dir, kTrainingEpochs);
  // Held in its first checkpoint write, the job cannot reach its next update.
  auto p = troupe_run(file, dir, "run", {}, {{"TROUPE_TEST_HOLD", "checkpoint:60"}});
  auto s = stop_when(*p, "holding at checkpoint", SIGINT, SIGINT, "stopping at the next update");
  CHECK_MESSAGE(s.rc == 130, s.log);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(contains(s.log, "SIGINT again: stopped at once"));
  CHECK_FALSE(has_checkpoint(dir));
  CHECK_FALSE(fs::exists(dir / "out/checkpoints/preempted.json"));
  const auto summary = summary_of(dir);
  CHECK(contains(summary["stop_reason"].get<std::string>(), "SIGINT again"));
  CHECK(summary["steps"] >= 50);
}

TEST_CASE("troupe run, SIGTERM while loading data: exit 143 at once, nothing written") {
  strategy_env env(2000);
  temp_dir dir;
  const auto file = run_config(env, dir, 1);
  auto p = troupe_run(file, dir, "run", {}, {{"TROUPE_TEST_HOLD", "loading:60"}});
  auto s = stop_when(*p, "holding at loading", SIGTERM);
  CHECK_MESSAGE(s.rc == 143, s.log);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(contains(s.log,
                 "SIGTERM during loading data: stopped at once, nothing to resume; "
                 "exiting with status 143"));
  CHECK_FALSE(fs::exists(dir / "out/summary.json"));
  CHECK_FALSE(has_checkpoint(dir));
}

TEST_CASE(
    "troupe run, Ctrl-C during the final evaluation or while writing results: exit at "
    "once, the summary says why") {
  struct row {
    const char* hold;
    int signal;
    int status;
    const char* said;
  };
  for (const row r : {row{"evaluating:60", SIGINT, 130, "SIGINT during the final evaluation"},
                      row{"writing:60", SIGTERM, 143, "SIGTERM during writing results"}}) {
    CAPTURE(r.hold);
    strategy_env env(2000);
    temp_dir dir;
    const auto file = run_config(env, dir, 1);
    auto p = troupe_run(file, dir, "run", {}, {{"TROUPE_TEST_HOLD", r.hold}});
    auto s = stop_when(*p, "holding at", r.signal);
    CHECK_MESSAGE(s.rc == r.status, s.log);
    CHECK(s.seconds < kPromptSeconds);
    CHECK(contains(s.log, std::string(r.said) + ": stopped at once, nothing to resume"));
    const auto summary = summary_of(dir);
    CHECK(contains(summary["stop_reason"].get<std::string>(), r.said));
    CHECK(summary["steps"] == 125);  // training was over
    CHECK_FALSE(fs::exists(dir / "out/checkpoints/preempted.json"));
  }
}

namespace {

// A mirrored job over a chief and one worker process, as run_config's.
cluster_job two_process_job(strategy_env& env, const temp_dir& dir, int64_t epochs,
                            double grace = 25, const std::string& log_level = "warn") {
  auto c = env.job("mirrored", "adam", 2, 16);
  c.logging.level = log_level;
  c.training.epochs = epochs;
  c.checkpoint.every_steps = 50;
  c.logging.output_dir = dir / "out";
  cluster_job job(c, dir.str(), 1, 0);
  job.json["cluster"]["grace_seconds"] = grace;
  std::ofstream(job.file) << job.json.dump(2);
  return job;
}

// A task alone: its peers never come, so it waits to join until the signal.
void check_stopped_while_joining(const std::string& task) {
  strategy_env env(2000);
  temp_dir dir;
  auto job = two_process_job(env, dir, 1, 25, "info");
  node_proc p(job.file, task, dir / "task.log", kSecret);
  // The chief's gate is open, a worker enrols with the chief (the job CA,
  // net/chief_enrol.hpp): either is joining.
  auto s = stop_when(p, task == "chief:0" ? "listening on" : "enrolling with chief:0", SIGTERM);
  CHECK_MESSAGE(s.rc == 143, s.log);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(contains(s.log, "SIGTERM during joining the cluster: stopped at once, nothing to resume"));
  CHECK_FALSE(fs::exists(dir / "out/summary.json"));
  CHECK_FALSE(has_checkpoint(dir));
}

}  // namespace

TEST_CASE("troupe node --task chief:0 waiting for its worker, SIGTERM: exit 143 at once") {
  check_stopped_while_joining("chief:0");
}

TEST_CASE("troupe node --task worker:0 waiting for the chief, SIGTERM: exit 143 at once") {
  check_stopped_while_joining("worker:0");
}

TEST_CASE("troupe node during the rendezvous (the chief not there), SIGTERM: exit 143 at once") {
  strategy_env env(2000);
  temp_dir dir;
  auto j = to_json(env.job("", "adam", 1, 16));
  j["cluster"] = {{"join_timeout_seconds", 60}, {"heartbeat_seconds", 1}};
  const std::string file = dir / "env_job.json";
  std::ofstream(file) << j.dump(2);
  node_proc p("rank1", dir / "rank1.log", kSecret, {TROUPE_BIN, "node", "--config", file},
              {{"TROUPE_RANK", "1"},
               {"TROUPE_WORLD_SIZE", "2"},
               {"TROUPE_CHIEF", "127.0.0.1:" + std::to_string(free_port())},
               {"TROUPE_ADVERTISE_ADDR", "127.0.0.1"},
               {"TROUPE_TEST_HOLD", "rendezvous:0"}});
  auto s = stop_when(p, "holding at rendezvous", SIGTERM);
  CHECK_MESSAGE(s.rc == 143, s.log);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(contains(s.log, "SIGTERM during the rendezvous: stopped at once, nothing to resume"));
}

TEST_CASE("troupe node, training that cannot stop within cluster.grace_seconds: exit 75 then") {
  strategy_env env(2000);
  temp_dir dir;
  auto job = two_process_job(env, dir, kTrainingEpochs, 0.5);
  // The chief is held in its first checkpoint write: it cannot stop in time.
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret, {},
                  {{"TROUPE_TEST_HOLD", "checkpoint:60"}});
  node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret);
  auto s = stop_when(chief, "holding at checkpoint", SIGTERM);
  CHECK_MESSAGE(s.rc == preemption::kResumeExitStatus, s.log);
  CHECK(s.seconds >= 0.5);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(contains(s.log, "the job did not stop within cluster.grace_seconds (0.5 s)"));
  CHECK(contains(summary_of(dir)["stop_reason"].get<std::string>(),
                 "did not stop within cluster.grace_seconds"));
}

TEST_CASE(
    "troupe node, a signal to a task its chief already stopped with a checkpoint: exit 75 at "
    "once") {
  strategy_env env(2000);
  temp_dir dir;
  auto job = two_process_job(env, dir, kTrainingEpochs);
  node_proc chief(job.file, "chief:0", dir / "chief.log", kSecret);
  // Told the end by its chief, the worker is held while it leaves.
  node_proc worker(job.file, "worker:0", dir / "worker.log", kSecret, {},
                   {{"TROUPE_TEST_HOLD", "leaving:60"}});
  auto c = stop_when(chief, "step 5", SIGTERM);
  CHECK_MESSAGE(c.rc == preemption::kResumeExitStatus, c.log);
  auto w = stop_when(worker, "holding at leaving", SIGTERM);
  CHECK_MESSAGE(w.rc == preemption::kResumeExitStatus, w.log);
  CHECK(w.seconds < kPromptSeconds);
  CHECK(contains(w.log, "SIGTERM while leaving a preempted job: its checkpoint is written"));
  CHECK(checkpoint::resolve(dir / "out/checkpoints").has_value());
}

namespace {

std::unique_ptr<node_proc> troupe_launch(const cluster_job& job, const temp_dir& dir,
                                         const std::string& name,
                                         std::vector<std::string> extra = {},
                                         const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> args{TROUPE_BIN, "launch", "--config", job.file};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<node_proc>(name, dir / (name + ".log"), kSecret, args, env);
}

}  // namespace

TEST_CASE(
    "troupe launch, Ctrl-C during training: every task stops with a checkpoint, their "
    "output kept, exit 75; launch --resume finishes the job") {
  strategy_env env(2000);
  temp_dir dir;
  auto job = two_process_job(env, dir, kTrainingEpochs);
  auto launcher = troupe_launch(job, dir, "launch");
  auto s = stop_when(*launcher, "[chief:0] step 5", SIGINT);
  CHECK_MESSAGE(s.rc == preemption::kResumeExitStatus, s.log);
  CHECK(contains(s.log, "troupe launch: got SIGINT; stopping all tasks"));
  CHECK(contains(s.log, "[chief:0] "));
  // The worker ends as a preempted task, either way the signal policy allows:
  // told by the chief first, or its own SIGINT seen once it was leaving.
  CHECK_MESSAGE(
      (contains(s.log, "[worker:0] task worker:0 finished") ||
       contains(s.log, "SIGINT while leaving a preempted job: its checkpoint is written")),
      s.log);
  CHECK_MESSAGE(contains(s.log, "[chief:0] job tiny preempted by SIGINT"), s.log);
  const auto summary = summary_of(dir);
  CHECK(contains(summary["stop_reason"].get<std::string>(), "preempted by SIGINT"));
  const int64_t stopped_at = summary["steps"];
  auto latest = checkpoint::resolve(dir / "out/checkpoints");
  REQUIRE(latest);
  CHECK(checkpoint::load(*latest).meta.step == stopped_at);
  auto again = troupe_launch(job, dir, "resumed", {"--resume"});
  REQUIRE_MESSAGE(again->wait(std::chrono::seconds(180)) == 0, again->output());
  const auto end = summary_of(dir);
  CHECK(end["steps"] == kTrainingSteps);
  CHECK(end["steps_this_run"] == kTrainingSteps - stopped_at);
}

TEST_CASE("troupe launch, SIGTERM while its tasks load data: every task stops at once, exit 143") {
  strategy_env env(2000);
  temp_dir dir;
  auto job = two_process_job(env, dir, 1);
  auto launcher = troupe_launch(job, dir, "launch", {}, {{"TROUPE_TEST_HOLD", "loading:60"}});
  REQUIRE(file_shows(launcher->log, "[worker:0] "));
  auto s = stop_when(*launcher, "[chief:0] [", SIGTERM);
  CHECK_MESSAGE(s.rc == 143, s.log);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(contains(s.log, "SIGTERM during loading data: stopped at once"));
  CHECK(
      contains(s.log, "interrupted by SIGTERM; stopped all tasks; exit status 143 (the chief's)"));
  CHECK_FALSE(fs::exists(dir / "out/summary.json"));
}

TEST_CASE(
    "troupe launch, SIGTERM during the chief's final evaluation: every task stops at once, "
    "exit 143, the summary says why") {
  strategy_env env(2000);
  temp_dir dir;
  auto job = two_process_job(env, dir, 1);
  auto launcher = troupe_launch(job, dir, "launch", {}, {{"TROUPE_TEST_HOLD", "evaluating:60"}});
  auto s = stop_when(*launcher, "[chief:0] [", SIGTERM);
  CHECK_MESSAGE(s.rc == 143, s.log);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(contains(s.log, "SIGTERM during the final evaluation: stopped at once"));
  // The worker, stopping too, ends as its chief did (143), not as a failure (1).
  CHECK(contains(s.log, "the chief left while this task stopped"));
  CHECK_FALSE(contains(s.log, "exited with status 1\n"));
  const auto summary = summary_of(dir);
  CHECK(contains(summary["stop_reason"].get<std::string>(), "during the final evaluation"));
  CHECK(summary["steps"] == 125);
  CHECK_FALSE(fs::exists(dir / "out/checkpoints/preempted.json"));
}

TEST_CASE(
    "troupe launch, Ctrl-C while the chief writes a checkpoint: the write completes, every "
    "task exits 75, launch --resume finishes the job") {
  strategy_env env(2000);
  temp_dir dir;
  auto job = two_process_job(env, dir, kTrainingEpochs);
  auto launcher = troupe_launch(job, dir, "launch", {}, {{"TROUPE_TEST_HOLD", "checkpoint:1"}});
  auto s = stop_when(*launcher, "holding at checkpoint", SIGINT);
  CHECK_MESSAGE(s.rc == preemption::kResumeExitStatus, s.log);
  CHECK(s.seconds < kPromptSeconds);
  CHECK(checkpoint::load(dir / "out/checkpoints/ckpt-0000000050").meta.step == 50);
  const int64_t stopped_at = summary_of(dir)["steps"];
  CHECK(checkpoint::load(*checkpoint::resolve(dir / "out/checkpoints")).meta.step == stopped_at);
  auto again = troupe_launch(job, dir, "resumed", {"--resume"});
  REQUIRE_MESSAGE(again->wait(std::chrono::seconds(180)) == 0, again->output());
  CHECK(summary_of(dir)["steps_this_run"] == kTrainingSteps - stopped_at);
}
