// `troupe launch` (cli/launch.hpp), with small /bin/sh scripts as the tasks.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/launch.hpp"
#include "config/cluster.hpp"
#include "fixtures.hpp"

using namespace troupe;
using namespace troupe::launch;

namespace {

child sh(const std::string& name, const std::string& script) {
  return {name, {"/bin/sh", "-c", script}, {"TROUPE_TASK=" + name}};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs supervise() with the children's output going to files.
struct run_result {
  int rc = -1;
  std::string out, err;
  double seconds = 0;
};

run_result run(const std::vector<child>& children, double grace = 3) {
  test::temp_dir dir;
  int out = ::open((dir / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int err = ::open((dir / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(out >= 0);
  REQUIRE(err >= 0);
  supervise_options o;
  o.grace_seconds = grace;
  o.out_fd = out;
  o.err_fd = err;
  run_result r;
  auto t0 = std::chrono::steady_clock::now();
  r.rc = supervise(children, o);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(out);
  ::close(err);
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  return r;
}

pid_t read_pid(const std::string& file) {
  std::ifstream in(file);
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// The process no longer runs (gone, or a zombie waiting for init to reap it).
bool gone(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
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
  CHECK(r.err.find("troupe launch: task worker:1 exited with status 3; stopping the other tasks") !=
        std::string::npos);
  CHECK(r.err.find("troupe launch:   task chief:0 killed by signal 15 (SIGTERM)") !=
        std::string::npos);
  CHECK(r.err.rfind("troupe launch: task worker:1 exited with status 3\n") != std::string::npos);
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
  auto r = run({sh("worker:0", "sleep 0.2; exit 1"),
                sh("worker:1", "trap '' TERM; echo $$ > " + dir / "stubborn.pid" +
                                   "; while :; do sleep 0.05; done")},
               0.5);
  CHECK(r.rc == 1);
  CHECK(r.seconds >= 0.6);
  CHECK(r.seconds < 2.5);
  CHECK(r.err.find("sending SIGKILL") != std::string::npos);
  CHECK(r.err.find("task worker:1 killed by signal 9 (SIGKILL)") != std::string::npos);
  CHECK(r.err.rfind("troupe launch: task worker:0 exited with status 1\n") != std::string::npos);
  CHECK(gone(read_pid(dir / "stubborn.pid")));
}

TEST_CASE("launch: a task killed by SIGKILL is reported as such") {
  auto r = run({sh("ps:0", "kill -9 $$"), sh("worker:0", "sleep 30")});
  CHECK(r.rc == 1);
  CHECK(r.seconds < 2.5);
  CHECK(r.err.find("troupe launch: task ps:0 killed by signal 9 (SIGKILL)") != std::string::npos);
}

TEST_CASE("launch: a command that cannot run is reported cleanly") {
  auto r = run({{"worker:0", {"/nonexistent/troupe-node", "node"}, {}}, sh("chief:0", "exit 0")});
  CHECK(r.rc == 1);
  CHECK(r.err.find("[worker:0] troupe launch: cannot run /nonexistent/troupe-node: No such file "
                   "or directory\n") != std::string::npos);
  CHECK(r.err.find("troupe launch: task worker:0 exited with status 127") != std::string::npos);
}

TEST_CASE("launch: SIGTERM to the launcher is forwarded to every task") {
  test::temp_dir dir;
  pid_files pids;
  pids.files = {dir / "a.pid", dir / "b.pid"};
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  // worker:0 plays the user: it sends SIGTERM to its parent, the launcher.
  auto r = run({sh("worker:0",
                   "echo $$ > " + dir / "a.pid" + "; sleep 0.2; kill -TERM $PPID; sleep 30 & wait"),
                sh("worker:1", "echo $$ > " + dir / "b.pid" + "; sleep 30 & wait")});
  CHECK(r.rc == 1);
  CHECK(r.seconds < 2.5);
  CHECK(r.err.find("troupe launch: got SIGTERM; stopping all tasks") != std::string::npos);
  CHECK(r.err.find("troupe launch: interrupted by SIGTERM; stopped all tasks") !=
        std::string::npos);
  CHECK(gone(read_pid(dir / "a.pid")));
  CHECK(gone(read_pid(dir / "b.pid")));
  // The launcher's handler is gone again: the one before it is back.
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  CHECK((now.sa_handler == before.sa_handler));
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
