// `troupe launch` (cli/launch.hpp), with small /bin/sh scripts as the tasks.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/launch.hpp"
#include "cli/options.hpp"
#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "fixtures.hpp"

using namespace troupe;
using namespace troupe::launch;

namespace {

child command(const std::string& name, std::vector<std::string> argv,
              std::vector<std::string> env = {}) {
  child c;
  c.name = name;
  c.argv = std::move(argv);
  c.env = std::move(env);
  return c;
}

child sh(const std::string& name, const std::string& script) {
  return command(name, {"/bin/sh", "-c", script}, {"TROUPE_TASK=" + name});
}

using troupe::test::read_file;

// Runs supervise() with the children's output going to files.
struct run_result {
  int rc = -1;
  std::string out, err;
  double seconds = 0;
};

run_result run(const std::vector<child>& children, double grace = 3,
               decltype(supervise_options::enrol) enrol = {}) {
  test::temp_dir dir;
  int out = ::open((dir / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int err = ::open((dir / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(out >= 0);
  REQUIRE(err >= 0);
  supervise_options o;
  o.grace_seconds = grace;
  o.out_fd = out;
  o.err_fd = err;
  o.enrol = std::move(enrol);
  run_result r;
  auto t0 = std::chrono::steady_clock::now();
  r.rc = supervise(children, o);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(out);
  ::close(err);
  r.out = read_file(dir / "out");
  r.err = read_file(dir / "err");
  return r;
}

pid_t read_pid(const std::string& file) {
  std::ifstream in(file);
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// A shell loop until `cond` holds.
std::string until(const std::string& cond) {
  return "until " + cond + "; do sleep 0.02; done; ";
}

// The process no longer runs (gone, or a zombie waiting for init to reap it).
bool gone(pid_t pid) {
  for (int i = 0; i < 500; ++i) {  // up to 10 s: CI runs it beside the sanitizer builds
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z')
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Whether `text` has a match of the regular expression `re` ($ matches at
// every line end).
bool has(const std::string& text, const std::string& re) {
  return std::regex_search(text, std::regex(re, std::regex::ECMAScript | std::regex::multiline));
}

// Kills what a failed test may have left behind.
struct pid_files {
  std::vector<std::string> files;
  ~pid_files() {
    for (const auto& f : files)
      if (pid_t p = read_pid(f); p > 1) ::kill(p, SIGKILL);
  }
};

}  // namespace

TEST_CASE("launch: every task succeeds -> 0, each line prefixed with its task") {
  const std::string script =
      "echo \"hello from $TROUPE_TASK\"; echo 'to stderr' >&2; "
      "i=0; while [ $i -lt 200 ]; do echo \"line $i of $TROUPE_TASK xxxxxxxxxxxxxxxx\"; "
      "i=$((i+1)); done; printf 'no newline'";
  auto r = run({sh("worker:0", script), sh("worker:1", script), sh("chief:0", "exit 0")});
  CHECK(r.rc == 0);
  CHECK(r.out.find("[worker:0] hello from worker:0\n") != std::string::npos);
  CHECK(r.out.find("[worker:1] hello from worker:1\n") != std::string::npos);
  CHECK(r.out.find("[worker:1] no newline\n") != std::string::npos);
  CHECK(r.err.find("[worker:0] to stderr\n") != std::string::npos);
  CHECK(r.err.find("[worker:1] to stderr\n") != std::string::npos);
  // No line is torn or mixed with another task's.
  std::istringstream lines(r.out);
  std::string line;
  int count = 0;
  const std::regex ok(R"(\[(worker:[01])\] (hello from \1|line \d+ of \1 x+|no newline))");
  while (std::getline(lines, line)) {
    ++count;
    CHECK_MESSAGE(std::regex_match(line, ok), line);
  }
  CHECK(count == 2 * 202);
  CHECK(r.err.find("troupe launch:") == std::string::npos);
}

TEST_CASE("launch: one task fails -> the others are stopped, exit 1 naming the task") {
  test::temp_dir dir;
  pid_files pids;
  auto waiter = [&](const std::string& name) {
    pids.files.push_back(dir / (name + ".pid"));
    pids.files.push_back(dir / (name + ".child"));
    // The sleep is the task's own child: it must go too.
    return sh(name, "echo $$ > " + dir / (name + ".pid") + "; sleep 30 & echo $! > " +
                        dir / (name + ".child") + "; wait");
  };
  auto r = run(
      {waiter("chief:0"), sh("worker:1", "sleep 0.3; echo failing; exit 3"), waiter("worker:0")});
  CHECK(r.rc == 1);
  CHECK(r.seconds < 2.5);
  CHECK(r.out.find("[worker:1] failing\n") != std::string::npos);
  CHECK(has(
      r.err,
      R"(troupe launch: task worker:1 \(pid \d+\) exited with status 3; stopping the other tasks)"));
  CHECK(has(r.err, R"(troupe launch:   task chief:0 \(pid \d+\) killed by signal 15 \(SIGTERM\))"));
  CHECK(has(r.err, R"(troupe launch: task worker:1 \(pid \d+\) exited with status 3\n$)"));
  for (const auto& f : pids.files) {
    pid_t p = read_pid(f);
    REQUIRE_MESSAGE(p > 1, f);
    CHECK_MESSAGE(gone(p), f);
  }
}

TEST_CASE("launch: a task that ignores SIGTERM is killed after the grace period") {
  test::temp_dir dir;
  pid_files pids;
  pids.files.push_back(dir / "stubborn.pid");
  // worker:0 ends the job once worker:1 is in its loop (its pid written).
  auto r = run({sh("worker:0", until("[ -s " + dir / "stubborn.pid" + " ]") + "sleep 0.2; exit 1"),
                sh("worker:1", "trap '' TERM; echo $$ > " + dir / "stubborn.pid" +
                                   "; while :; do sleep 0.05; done")},
               0.5);
  CHECK(r.rc == 1);
  CHECK(r.seconds >= 0.6);
  CHECK(r.seconds < 2.5);
  CHECK(r.err.find("sending SIGKILL") != std::string::npos);
  CHECK(has(r.err, R"(task worker:1 \(pid \d+\) killed by signal 9 \(SIGKILL\))"));
  CHECK(has(r.err, R"(troupe launch: task worker:0 \(pid \d+\) exited with status 1\n$)"));
  CHECK(gone(read_pid(dir / "stubborn.pid")));
}

TEST_CASE("launch: a task killed by SIGKILL is reported as such") {
  auto r = run({sh("ps:0", "kill -9 $$"), sh("worker:0", "sleep 30")});
  CHECK(r.rc == 1);
  CHECK(r.seconds < 2.5);
  CHECK(has(r.err, R"(troupe launch: task ps:0 \(pid \d+\) killed by signal 9 \(SIGKILL\))"));
}

TEST_CASE("launch: a command that cannot run is reported cleanly") {
  auto r =
      run({command("worker:0", {"/nonexistent/troupe-node", "node"}), sh("chief:0", "exit 0")});
  CHECK(r.rc == 1);
  CHECK(r.err.find("[worker:0] troupe launch: cannot run /nonexistent/troupe-node: No such file "
                   "or directory\n") != std::string::npos);
  CHECK(has(r.err, R"(troupe launch: task worker:0 \(pid \d+\) exited with status 127)"));
}

TEST_CASE("launch: SIGTERM to the launcher is forwarded to every task") {
  test::temp_dir dir;
  pid_files pids;
  pids.files = {dir / "a.pid", dir / "b.pid"};
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  // worker:0 plays the user: it sends SIGTERM to its parent, the launcher.
  auto r = run(
      {sh("worker:0", "echo $$ > " + dir / "a.pid" + "; " + until("[ -s " + dir / "b.pid" + " ]") +
                          "sleep 0.2; kill -TERM $PPID; sleep 30 & wait"),
       sh("worker:1", "echo $$ > " + dir / "b.pid" + "; sleep 30 & wait")});
  // The tasks' status, as a shell reports a process ended by SIGTERM.
  CHECK(r.rc == 143);
  CHECK(r.seconds < 2.5);
  CHECK(r.err.find("troupe launch: got SIGTERM; stopping all tasks") != std::string::npos);
  CHECK(r.err.find("troupe launch: interrupted by SIGTERM; stopped all tasks; exit status 143 "
                   "(the tasks')") != std::string::npos);
  CHECK(gone(read_pid(dir / "a.pid")));
  CHECK(gone(read_pid(dir / "b.pid")));
  // The launcher's handler is gone again: the one before it is back.
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  CHECK((now.sa_handler == before.sa_handler));
}

TEST_CASE("launch: a second Ctrl-C is forwarded too; the exit status is the chief's") {
  test::temp_dir dir;
  pid_files pids;
  pids.files = {dir / "chief.pid"};
  // The chief stops at the second SIGINT only, as troupe node does while
  // training; worker:0 plays the user pressing Ctrl-C twice.
  auto chief = sh("chief:0",
                  "n=0; trap 'n=$((n+1)); echo got SIGINT $n; [ $n -ge 2 ] && exit 130' "
                  "INT; echo $$ > " +
                      dir / "chief.pid" + "; while :; do sleep 0.02; done");
  chief.chief = true;
  auto r = run({chief, sh("worker:0", "trap '' INT; " + until("[ -s " + dir / "chief.pid" + " ]") +
                                          "kill -INT $PPID; sleep 0.3; kill -INT $PPID")});
  CHECK(r.rc == 130);
  CHECK(r.seconds < 2.5);
  CHECK(r.out.find("[chief:0] got SIGINT 1\n[chief:0] got SIGINT 2\n") != std::string::npos);
  CHECK(r.err.find("troupe launch: got SIGINT again; forwarded: every task stops at once") !=
        std::string::npos);
  CHECK(r.err.find("exit status 130 (the chief's)") != std::string::npos);
  CHECK(gone(read_pid(dir / "chief.pid")));
}

TEST_CASE("launch: node commands for every task of the cluster spec") {
  cluster_spec spec;
  spec.tasks = {{"chief", {"127.0.0.1:7000"}}, {"worker", {"127.0.0.1:7001", "127.0.0.1:7002"}}};
  launch_options o;
  o.output_dir = "runs/x";
  o.resume = true;
  o.extra_args = {"--quiet"};
  o.node_command = {"/usr/bin/troupe", "node"};
  ::unsetenv("TROUPE_LAUNCH_NODE_CMD");
  auto cs = node_children(spec, "job.json", o);
  REQUIRE(cs.size() == 3);
  CHECK(cs[0].name == "chief:0");
  CHECK(cs[2].name == "worker:1");
  CHECK(cs[2].argv == std::vector<std::string>{"/usr/bin/troupe", "node", "--config", "job.json",
                                               "--task", "worker:1", "--output", "runs/x",
                                               "--resume", "--quiet"});
  CHECK(cs[2].env == std::vector<std::string>{"TROUPE_TASK=worker:1"});
  // Default: this binary's `node` subcommand.
  auto def = node_children(spec, "job.json", {});
  CHECK(def[0].argv[0].find('/') == 0);
  CHECK(def[0].argv[1] == "node");

  // TROUPE_LAUNCH_NODE_CMD: a shell command line that gets the arguments.
  ::setenv("TROUPE_LAUNCH_NODE_CMD", "echo node", 1);
  auto env = node_children(spec, "job.json", o);
  ::unsetenv("TROUPE_LAUNCH_NODE_CMD");
  CHECK(env[1].argv[0] == "/bin/sh");
  auto r = run(env);
  CHECK(r.rc == 0);
  CHECK(r.out.find("[worker:1] node --config job.json --task worker:1 --output runs/x --resume "
                   "--quiet\n") != std::string::npos);
  CHECK(r.out.find("[chief:0] node --config job.json --task chief:0") != std::string::npos);
}

TEST_CASE("launch: usage and config errors exit 2") {
  test::temp_dir dir;
  std::string used;
  auto bad = [&](const std::string& why) {
    used = why;
    return 2;
  };
  CHECK(cmd_launch({}, bad) == 2);
  CHECK(used.find("needs a config file") != std::string::npos);
  CHECK(cmd_launch({"x.json", "--resume", "--overwrite"}, bad) == 2);
  CHECK(used == "--resume and --overwrite exclude each other");
  CHECK(cmd_launch({"--config", "x.json", "--frob"}, bad) == 2);
  CHECK(used == "unknown option '--frob' for launch");
  used.clear();
  std::ofstream(dir / "single.json") << "{}";
  CHECK(cmd_launch({"--config", dir / "single.json"}, bad) == 2);  // no cluster
  std::ofstream(dir / "bad.json") << R"({"cluster": {"tasks": {"chief": ["x"]}}})";
  CHECK(cmd_launch({"--config", dir / "bad.json"}, bad) == 2);
  CHECK(used.empty());
}

TEST_CASE("the option parser of run, node and launch: each usage error, in order") {
  // node's options as cli/main.cpp declares them.
  struct node_args {
    std::string file, task, output;
    bool resume = false, overwrite = false;
    std::vector<std::string> rest;
  };
  auto node_error = [](const std::vector<std::string>& args, node_args& n) {
    cli::option_parser p("node");
    p.config_file(n.file, true, "node needs a config file")
        .value("--output", n.output, "--output needs a directory")
        .value("--task", n.task, "--task needs a task name, e.g. worker:0")
        .flag("--resume", n.resume)
        .flag("--overwrite", n.overwrite)
        .exclusive("--resume", "--overwrite");
    return p.parse(args).value_or("");
  };
  node_args n;
  CHECK(node_error({"--config", "a.json", "--task", "worker:0", "--output", "--resume"}, n) == "");
  CHECK((n.file == "a.json" && n.task == "worker:0" && n.output == "--resume" && !n.resume));
  n = {};
  CHECK(node_error({"a.json", "--config", "b.json"}, n) == "node takes one config file");
  n = {};
  CHECK(node_error({"--config", "a.json", "b.json"}, n) ==
        "node takes one config file, got 'a.json' and 'b.json'");
  n = {};
  CHECK(node_error({"a.json", "--task"}, n) == "--task needs a task name, e.g. worker:0");
  n = {};
  CHECK(node_error({"a.json", "--"}, n) == "unknown option '--' for node");
  n = {};
  // The arguments first, then the missing file, then exclusive flags.
  CHECK(node_error({"--resume", "--overwrite", "--frob"}, n) == "unknown option '--frob' for node");
  n = {};
  CHECK(node_error({"--resume", "--overwrite"}, n) == "node needs a config file");
  n = {};
  CHECK(node_error({"a.json", "--overwrite", "--resume"}, n) ==
        "--resume and --overwrite exclude each other");

  // After `--`, nothing is parsed.
  std::string file;
  std::vector<std::string> rest;
  cli::option_parser launch("launch");
  launch.config_file(file, false, "launch needs a config file").rest_after_dashes(rest);
  CHECK(launch.parse({"a.json", "--", "--frob", "b"}) == std::nullopt);
  CHECK(rest == std::vector<std::string>{"--frob", "b"});
}

// The tests below order events through files, not sleeps: a chief script
// waits for what the workers do.
namespace {

child chief_sh(const std::string& script) {
  auto c = sh("chief:0", script);
  c.chief = true;
  return c;
}

child survivable_sh(const std::string& name, const std::string& script) {
  auto c = sh(name, script);
  c.survivable = true;
  return c;
}

supervise_options with_restarts(int n) {
  supervise_options o;
  o.restart_workers = n;
  return o;
}

run_result run_with(const std::vector<child>& children, supervise_options o) {
  test::temp_dir dir;
  int out = ::open((dir / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int err = ::open((dir / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(out >= 0);
  REQUIRE(err >= 0);
  o.out_fd = out;
  o.err_fd = err;
  run_result r;
  r.rc = supervise(children, o);
  ::close(out);
  ::close(err);
  r.out = read_file(dir / "out");
  r.err = read_file(dir / "err");
  return r;
}

}  // namespace

TEST_CASE("launch: a survivable task that dies is reported, the job goes on, the chief's code") {
  test::temp_dir dir;
  pid_files pids;
  pids.files = {dir / "w0.pid", dir / "w1.pid"};
  // worker:0 dies of SIGKILL; the chief waits until the launcher has reaped
  // it (and until worker:1 has written its pid, which the test checks
  // later: under load it may start after worker:0 died), then ends with 7
  // (the launcher's code); worker:1 follows the chief.
  const std::string w0 = dir / "w0.pid";
  const std::string w1 = dir / "w1.pid";
  auto r = run_with(
      {chief_sh(until("[ -s " + w0 + " ]") + until("! kill -0 $(cat " + w0 + ") 2>/dev/null") +
                until("[ -s " + w1 + " ]") + "echo chief done; exit 7"),
       survivable_sh("worker:0", "echo $$ > " + w0 + "; kill -9 $$"),
       survivable_sh("worker:1", "echo $$ > " + dir / "w1.pid" + "; sleep 30 & wait")},
      {});
  CHECK(r.rc == 7);
  CHECK(r.out.find("[chief:0] chief done\n") != std::string::npos);
  CHECK_MESSAGE(has(r.err, "troupe launch: task worker:0 \\(pid " + std::to_string(read_pid(w0)) +
                               "\\) killed by signal 9 \\(SIGKILL\\); the job goes on without it$"),
                r.err);
  CHECK(r.err.find("restarting") == std::string::npos);
  // The chief's end ends the job: worker:1 is stopped, the chief named.
  CHECK(
      has(r.err, R"(task chief:0 \(pid \d+\) exited with status 7; the job ends with the chief)"));
  CHECK(
      has(r.err, R"(troupe launch:   task worker:1 \(pid \d+\) killed by signal 15 \(SIGTERM\))"));
  CHECK(gone(read_pid(dir / "w1.pid")));
}

TEST_CASE("launch: --restart-workers starts a dead survivable task again, up to N times in all") {
  test::temp_dir dir;
  pid_files pids;
  pids.files = {dir / "pid.0", dir / "pid.1", dir / "pid.2"};
  // Every run of worker:0 dies; runs are counted in a file. The chief ends
  // once the second run is reaped, and must not see a third.
  const std::string count = dir / "count";
  const std::string worker = "n=$(cat " + count + " 2>/dev/null || echo 0); echo $((n+1)) > " +
                             count + "; echo \"run $n\"; echo $$ > " + dir.str() +
                             "/pid.$n; kill -9 $$";
  const std::string second = dir / "pid.1";
  auto r = run_with({chief_sh(until("[ -s " + second + " ]") +
                              until("! kill -0 $(cat " + second + ") 2>/dev/null") + "exit 0"),
                     survivable_sh("worker:0", worker)},
                    with_restarts(1));
  CHECK(r.rc == 0);
  CHECK(r.out.find("[worker:0] run 0\n") != std::string::npos);
  CHECK(r.out.find("[worker:0] run 1\n") != std::string::npos);
  CHECK(r.out.find("run 2") == std::string::npos);
  CHECK(read_file(count) == "2\n");
  const auto first = std::to_string(read_pid(dir / "pid.0"));
  const auto again = std::to_string(read_pid(second));
  CHECK_MESSAGE(has(r.err, "task worker:0 \\(pid " + first +
                               "\\) killed by signal 9 \\(SIGKILL\\); the job goes on without it$"),
                r.err);
  CHECK(r.err.find("troupe launch: restarting task worker:0 (restart 1 of 1)\n") !=
        std::string::npos);
  CHECK_MESSAGE(has(r.err, "task worker:0 \\(pid " + again +
                               "\\) killed by signal 9 \\(SIGKILL\\); the job goes on without it "
                               "\\(no restarts left: 1 of 1 used\\)$"),
                r.err);
}

TEST_CASE("launch: a task the job cannot lose stops every task, named with why") {
  test::temp_dir dir;
  pid_files pids;
  pids.files = {dir / "chief.pid"};
  auto w = sh("worker:1", until("[ -s " + dir / "chief.pid" + " ]") + "kill -9 $$");
  w.why_fatal = "the mirrored strategy does not go on without a task";
  auto r = run_with({chief_sh("echo $$ > " + dir / "chief.pid" + "; sleep 30 & wait"),
                     sh("worker:0", "sleep 30 & wait"), w},
                    with_restarts(3));
  CHECK(r.rc == 1);
  CHECK_MESSAGE(
      has(r.err,
          R"(troupe launch: task worker:1 \(pid \d+\) killed by signal 9 \(SIGKILL\); )"
          R"(the mirrored strategy does not go on without a task; stopping the other tasks)"),
      r.err);
  CHECK(r.err.find("restarting") == std::string::npos);
  CHECK(
      has(r.err, R"(troupe launch: task worker:1 \(pid \d+\) killed by signal 9 \(SIGKILL\)\n$)"));
  CHECK(gone(read_pid(dir / "chief.pid")));
}

TEST_CASE("launch: after the chief exits 0, a task that does not follow is stopped; exit 0") {
  test::temp_dir dir;
  pid_files pids;
  pids.files = {dir / "stuck.pid"};
  auto o = with_restarts(1);
  o.after_chief_seconds = 0.2;
  auto r =
      run_with({chief_sh(until("[ -s " + dir / "stuck.pid" + " ]") + "exit 0"),
                survivable_sh("worker:0", "echo $$ > " + dir / "stuck.pid" + "; sleep 30 & wait")},
               o);
  CHECK(r.rc == 0);
  CHECK(
      r.err.find("troupe launch: tasks still running 0.2 s after the chief ended; stopping them") !=
      std::string::npos);
  CHECK(r.err.find("restarting") == std::string::npos);
  CHECK(gone(read_pid(dir / "stuck.pid")));
}

TEST_CASE("launch: which tasks a job survives losing follows its strategy") {
  auto base = to_json(load_job_config(std::string(TROUPE_SOURCE_DIR) +
                                      "/examples/fashion_mnist_parameter_server.json"));
  base["cluster"] = {{"tasks",
                      {{"chief", {"127.0.0.1:7000"}},
                       {"worker", {"127.0.0.1:7001", "127.0.0.1:7002"}},
                       {"ps", {"127.0.0.1:7003"}}}}};
  auto roles = [](const nlohmann::json& j) {
    auto c = parse_job_config(j);
    auto cs = node_children(*c.cluster, "job.json", {});
    apply_failure_policy(cs, c);
    std::map<std::string, std::string> out;
    for (const auto& x : cs)
      out[x.name] = x.chief ? "chief" : x.survivable ? "survivable" : "fatal: " + x.why_fatal;
    return out;
  };
  auto ps = roles(base);
  CHECK(ps["chief:0"] == "chief");
  CHECK(ps["worker:0"] == "survivable");
  CHECK(ps["worker:1"] == "survivable");
  CHECK(ps["ps:0"] == "fatal: the job does not go on without it: it hosts variable shards");

  auto easgd = base;
  easgd["strategy"] = {{"kind", "elastic_average"}, {"replicas", 4}};
  auto e = roles(easgd);
  CHECK(e["worker:1"] == "survivable");
  CHECK(e["ps:0"] == "fatal: the job does not go on without it: it hosts variable shards");

  auto rl = to_json(
      load_job_config(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_impala_2proc.json"));
  auto a = roles(rl);
  CHECK(a["chief:0"] == "chief");
  CHECK(a["worker:0"] == "survivable");

  auto mirrored = base;
  mirrored["strategy"] = {{"kind", "mirrored"}, {"replicas", 4}};
  mirrored["cluster"]["tasks"].erase("ps");
  auto m = roles(mirrored);
  CHECK(m["chief:0"] == "chief");
  CHECK(m["worker:0"] == "fatal: the mirrored strategy does not go on without a task");
  CHECK(m["worker:1"] == "fatal: the mirrored strategy does not go on without a task");
}

TEST_CASE("launch: bad --restart-workers values exit 2 naming the option") {
  std::string used;
  auto bad = [&](const std::string& why) {
    used = why;
    return 2;
  };
  for (const char* v :
       {"-1", "x", "", "1.5", "2x", "+1", " 1", "99999999999999999999", "1000001"}) {
    used.clear();
    CHECK_MESSAGE(cmd_launch({"x.json", "--restart-workers", v}, bad) == 2, v);
    CHECK_MESSAGE(used == std::string("--restart-workers needs the number of restarts (0 to "
                                      "1000000), got '") +
                              v + "'",
                  used);
  }
  used.clear();
  CHECK(cmd_launch({"x.json", "--restart-workers"}, bad) == 2);
  CHECK(used == "--restart-workers needs the number of restarts (0 to 1000000)");
}

TEST_CASE("launch: with enrolment each start inherits one socket of its own in TROUPE_ENROL_FD") {
  // What a task sees: the variable, and how many sockets it holds (only its own).
  const std::string script =
      "echo \"fd=${TROUPE_ENROL_FD:-none} sockets=$(ls -l /proc/$$/fd | grep -c socket)\"";
  ::setenv("TROUPE_ENROL_FD", "99", 1);  // an inherited one never passes on
  auto plain = run({sh("a", script)});
  std::vector<std::string> asked;
  auto enrolled = run({sh("a", script), sh("b", script)}, 3,
                      [&asked](const child& c, std::string_view, std::string&) {
                        asked.push_back(c.name);
                        return std::string();
                      });
  ::unsetenv("TROUPE_ENROL_FD");
  CHECK(plain.rc == 0);
  CHECK(plain.out == "[a] fd=none sockets=0\n");
  CHECK(enrolled.rc == 0);
  for (const std::string name : {"a", "b"}) {
    auto at = enrolled.out.find("[" + name + "] fd=");
    REQUIRE_MESSAGE(at != std::string::npos, enrolled.out);
    CHECK_MESSAGE(enrolled.out.find(" sockets=1\n", at) ==
                      enrolled.out.find('\n', at) - std::string(" sockets=1").size(),
                  enrolled.out);
    CHECK(enrolled.out.find("[" + name + "] fd=none") == std::string::npos);
  }
  CHECK(asked.empty());  // the scripts never asked: nothing was issued
}
