#pragma once
// troupe as a child process in tests (test_nodes, test_signals,
// test_monitoring): started with its output in a log file, waited for with a
// limit, killed if a test leaves it running; a cluster config of free ports
// on 127.0.0.1.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "config/job_config.hpp"
#include "tests/fixtures.hpp"
#include "tests/free_port.hpp"

namespace troupe::test {

using clock_type = std::chrono::steady_clock;

// A strong secret (`openssl rand -hex 32`): a guessable one is refused
// (config/secret.hpp).
inline constexpr const char* kSecret =
    "7834a8fdce0a3a0077c828817deb43cd1a958f30a0a43568bf0d69e58e998062";

// One `troupe node` child; killed (SIGKILL) if still running when destroyed.
struct node_proc {
  std::string task;
  std::string log;
  pid_t pid = -1;
  int status = -1;

  node_proc(const std::string& config, const std::string& t, const std::string& log_path,
            const std::string& secret, std::vector<std::string> extra = {},
            const std::map<std::string, std::string>& env = {})
      : node_proc(
            t, log_path, secret,
            [&] {
              std::vector<std::string> args{TROUPE_BIN, "node", "--config", config, "--task", t};
              for (auto& e : extra) args.push_back(e);
              return args;
            }(),
            env) {}
  // Any troupe command line (args[0] is the binary); `env`: variables set
  // in the child only.
  node_proc(const std::string& name, const std::string& log_path, const std::string& secret,
            std::vector<std::string> args, const std::map<std::string, std::string>& env = {})
      : task(name), log(log_path) {
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (secret.empty())
        ::unsetenv("TROUPE_SECRET");
      else
        ::setenv("TROUPE_SECRET", secret.c_str(), 1);
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  node_proc(const node_proc&) = delete;
  ~node_proc() {
    if (pid > 0 && status < 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  bool running() {
    if (status >= 0) return false;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;
    status = -1;
    return true;
  }
  // Waits up to `limit`; the exit code, or -signal; kills it and fails the
  // test when it is still running.
  int wait(std::chrono::duration<double> limit) {
    auto end = clock_type::now() + limit;
    while (running() && clock_type::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (status < 0) {
      FAIL_CHECK(task << " still running after " << limit.count() << " s; its log:\n" << output());
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  std::string output() const { return read_file(log); }
};

// A job config file with a cluster of free ports on 127.0.0.1.
struct cluster_job {
  std::string file;
  std::map<std::string, std::string> address;  // task -> host:port
  nlohmann::json json;
  cluster_job(const job_config& c, const std::string& dir, int workers, int ps,
              double join_timeout = 30) {
    json = to_json(c);
    nlohmann::json tasks;
    auto add = [&](const std::string& job, int n) {
      for (int i = 0; i < n; ++i) {
        // The OS may hand out a port it just gave (each is closed at once).
        std::string a;
        do a = "127.0.0.1:" + std::to_string(free_port());
        while (std::any_of(address.begin(), address.end(),
                           [&](const auto& kv) { return kv.second == a; }));
        tasks[job].push_back(a);
        address[job + ":" + std::to_string(i)] = a;
      }
    };
    add("chief", 1);
    add("worker", workers);
    add("ps", ps);
    json["cluster"] = {
        {"tasks", tasks}, {"join_timeout_seconds", join_timeout}, {"heartbeat_seconds", 0.5}};
    file = dir + "/job.json";
    std::ofstream(file) << json.dump(2);
  }
};

using node_procs = std::map<std::string, std::unique_ptr<node_proc>>;

// Whether `file` comes to hold `text` within 60 s (a running job's metrics).
inline bool file_shows(const std::string& file, const std::string& text) {
  auto until = clock_type::now() + std::chrono::seconds(60);
  while (read_file(file).find(text) == std::string::npos && clock_type::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return read_file(file).find(text) != std::string::npos;
}

}  // namespace troupe::test
