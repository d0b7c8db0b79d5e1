// `troupe launch`: local child processes for every task of a cluster spec.
#include "cli/launch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "config/secret.hpp"
#include "config/strategy_rules.hpp"
#include "runtime/stop_policy.hpp"

namespace troupe::launch {
namespace {

using clock = std::chrono::steady_clock;

constexpr std::size_t kMaxLine = 64 << 10;  // a longer line is relayed in pieces
constexpr int kMaxRestarts = 1000000;       // --restart-workers at most

int g_signal_pipe = -1;  // write end of the self-pipe the signal handler feeds

extern "C" void on_signal(int sig) {
  int saved = errno;
  auto b = static_cast<unsigned char>(sig);
  if (g_signal_pipe >= 0) {
    [[maybe_unused]] ssize_t n = ::write(g_signal_pipe, &b, 1);
  }
  errno = saved;
}

void write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to write to: drop, the children go on
    done += static_cast<std::size_t>(n);
  }
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           signal_name(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

// One output stream of a child: its pipe and the partial line read so far.
struct stream {
  int fd = -1;
  int to = 1;
  std::string pending;
};

struct running {
  const child* spec = nullptr;
  std::string prefix;
  pid_t pid = -1;
  bool alive = false;
  int status = 0;
  stream out, err;
};

void emit_lines(stream& s, const std::string& prefix, bool flush_all) {
  std::size_t start = 0;
  for (;;) {
    std::size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    write_all(s.to, prefix + s.pending.substr(start, nl - start + 1));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (!s.pending.empty() && (flush_all || s.pending.size() >= kMaxLine)) {
    write_all(s.to, prefix + s.pending + "\n");
    s.pending.clear();
  }
}

// Reads what is there; closes the stream at end of file.
void drain(stream& s, const std::string& prefix) {
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      s.pending.append(buf, static_cast<std::size_t>(n));
      emit_lines(s, prefix, false);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // End of file or an error: the writer is gone.
    emit_lines(s, prefix, true);
    ::close(s.fd);
    s.fd = -1;
    return;
  }
}

void close_stream(stream& s, const std::string& prefix) {
  if (s.fd < 0) return;
  emit_lines(s, prefix, true);
  ::close(s.fd);
  s.fd = -1;
}

// Saves and restores the handlers supervise() installs.
struct signal_scope {
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1, SIGCHLD};
  static constexpr int kCount = sizeof kSignals / sizeof kSignals[0];
  struct sigaction old[kCount] {};
  int pipe_fds[2] = {-1, -1};
  bool ok = false;

  signal_scope() {
    if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) return;
    g_signal_pipe = pipe_fds[1];
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &sa, &old[i]);
    ok = true;
  }
  ~signal_scope() {
    if (ok)
      for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &old[i], nullptr);
    g_signal_pipe = -1;
    for (int fd : pipe_fds)
      if (fd >= 0) ::close(fd);
  }
  signal_scope(const signal_scope&) = delete;
  signal_scope& operator=(const signal_scope&) = delete;
};

// fork + exec of one child, its stdout/stderr on fresh pipes. Returns false
// (with `why`) when it could not be started at all.
bool start(running& r, int out_to, int err_to, std::string& why) {
  const child& c = *r.spec;
  if (c.argv.empty()) {
    why = "no command for task " + c.name;
    return false;
  }
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    why = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    why = std::string("pipe: ") + std::strerror(errno);
    ::close(out[0]);
    ::close(out[1]);
    return false;
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : c.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    bool overridden = false;
    for (const auto& x : c.env) {
      auto eq = x.find('=');
      if (kv.compare(0, eq + 1, x, 0, eq + 1) == 0) overridden = true;
    }
    if (!overridden) env_store.push_back(std::move(kv));
  }
  for (const auto& x : c.env) env_store.push_back(x);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string exec_failed = "troupe launch: cannot run " + c.argv[0] + ": ";
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    why = std::string("fork: ") + std::strerror(errno);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return false;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);  // the launcher is already gone
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGCHLD, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      if (devnull != 0) ::close(devnull);
    }
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(argv[0], argv.data(), envp.data());
    int e = errno;
    [[maybe_unused]] auto n1 = ::write(2, exec_failed.data(), exec_failed.size());
    const char* msg = std::strerror(e);
    [[maybe_unused]] auto n2 = ::write(2, msg, std::strlen(msg));
    [[maybe_unused]] auto n3 = ::write(2, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so a signal to the group cannot race the child's own call
  ::close(out[1]);
  ::close(err[1]);
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  r.pid = pid;
  r.alive = true;
  r.out = {out[0], out_to, {}};
  r.err = {err[0], err_to, {}};
  return true;
}

// Has the child ended? If so, kill what is left of its process group while
// its zombie still holds the group's id, then reap it.
bool reap(running& r) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
    return false;
  if (info.si_pid != r.pid) return false;
  ::kill(-r.pid, SIGKILL);
  int status = 0;
  while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = status;
  r.alive = false;
  return true;
}

clock::time_point after_seconds(double s) {
  return clock::now() +
         std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(s));
}

// The launcher stopping its tasks: a signal to every one, then SIGKILL
// past a deadline.
struct stopper {
  std::vector<running>& rs;
  bool stopping = false, killed = false, forwarded_again = false;
  clock::time_point kill_at{};
  int interrupted_by = 0;  // the signal the launcher got, if one stopped the job

  void stop_all(int sig, double grace_seconds) {
    for (auto& r : rs)
      if (r.alive) ::kill(-r.pid, sig);
    if (sig == SIGKILL) killed = true;
    if (!stopping) {
      stopping = true;
      kill_at = after_seconds(grace_seconds);
    }
  }

  // A signal to the launcher, forwarded: the tasks apply the signal policy
  // (runtime/stop_policy.hpp): the first stops them (at their next update
  // with a checkpoint when training), a second SIGINT/SIGTERM at once; a
  // third kills them.
  template <class Say>
  void on_signal(int sig, const supervise_options& opts, const Say& say) {
    if (!stopping) {
      interrupted_by = sig;
      say("got " + signal_name(sig) + "; stopping all tasks (forwarded to each)");
      stop_all(sig, opts.signal_grace_seconds);
    } else if (sig == SIGUSR1 || killed) {
      return;
    } else if (!forwarded_again) {
      forwarded_again = true;
      say("got " + signal_name(sig) + " again; forwarded: every task stops at once");
      stop_all(sig, 0);
      kill_at = std::min(kill_at, after_seconds(2));
    } else {
      say("got " + signal_name(sig) + " a third time; killing all tasks");
      stop_all(SIGKILL, 0);
    }
  }
};

// What a shell reports for a child: its exit status, or 128 + the signal
// that ended it (runtime/stop_policy.hpp's statuses pass through unchanged).
int shell_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return stop_policy::status_after(WTERMSIG(status));
  return 1;
}

// After the launcher forwarded a signal: the chief's status, or without a
// chief the first task's that did not exit 0.
int interrupted_status(const std::vector<running>& rs, const running* chief) {
  if (chief) return shell_status(chief->status);
  for (const auto& r : rs)
    if (r.pid > 0 && shell_status(r.status) != 0) return shell_status(r.status);
  return 0;
}

// 3 -> "3", 0.5 -> "0.5".
std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace

int supervise(const std::vector<child>& children, const supervise_options& opts) {
  auto say = [&](const std::string& line) {
    write_all(opts.err_fd, "troupe launch: " + line + "\n");
  };
  signal_scope signals;
  if (!signals.ok) {
    say(std::string("cannot create a pipe: ") + std::strerror(errno));
    return 1;
  }
  std::vector<running> rs(children.size());
  running* chief = nullptr;
  for (std::size_t i = 0; i < children.size(); ++i) {
    rs[i].spec = &children[i];
    rs[i].prefix = "[" + children[i].name + "] ";
    if (children[i].chief && !chief) chief = &rs[i];
  }
  auto ok = [](int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; };
  auto who = [](const running& r) {
    return "task " + r.spec->name + " (pid " + std::to_string(r.pid) + ")";
  };

  stopper stops{rs};
  auto& [_, stopping, killed, forwarded_again, kill_at, interrupted_by] = stops;
  std::optional<std::string> failure;  // the first task that failed, and how
  int restarts = 0;                    // survivable tasks started again, in all
  bool chief_ended = false;            // the chief is reaped
  bool chief_on_its_own = false;       // ... and it ended before the launcher stopped anything
  std::optional<clock::time_point> after_chief_at;  // then the others get SIGTERM
  auto stop_all = [&](int sig) { stops.stop_all(sig, opts.grace_seconds); };
  auto start_one = [&](running& r) {
    std::string why;
    if (!start(r, opts.out_fd, opts.err_fd, why)) {
      say("cannot start task " + r.spec->name + ": " + why);
      return false;
    }
    if (opts.log_starts) say(who(r) + " started");
    return true;
  };

  for (auto& r : rs) {
    if (!start_one(r)) {
      failure = "task " + r.spec->name + " could not be started";
      stop_all(SIGTERM);
      break;
    }
  }

  auto any_alive = [&] {
    for (const auto& r : rs)
      if (r.alive) return true;
    return false;
  };
  // Until every child is reaped; then a short while for output still in the pipes.
  std::optional<clock::time_point> drain_until;
  for (;;) {
    if (!any_alive() && !drain_until) drain_until = clock::now() + std::chrono::milliseconds(500);
    std::vector<pollfd> fds;
    std::vector<stream*> owners;
    fds.push_back({signals.pipe_fds[0], POLLIN, 0});
    owners.push_back(nullptr);
    for (auto& r : rs)
      for (stream* s : {&r.out, &r.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back(s);
        }
    if (drain_until && fds.size() == 1) break;
    int timeout = -1;
    auto now = clock::now();
    auto ms_until = [&](clock::time_point t) {
      return static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1));
    };
    if (drain_until) {
      if (now >= *drain_until) break;
      timeout = ms_until(*drain_until);
    } else if (stopping && !killed) {
      timeout = ms_until(kill_at);
    } else if (stopping) {
      timeout = 100;  // SIGKILLed: reap soon
    } else if (after_chief_at) {
      timeout = ms_until(*after_chief_at);
    }
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      say(std::string("poll: ") + std::strerror(errno));
      stop_all(SIGKILL);
    }
    if (n > 0) {
      for (std::size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) {
          for (auto& r : rs)
            if (&r.out == owners[i] || &r.err == owners[i]) drain(*owners[i], r.prefix);
        }
      if (fds[0].revents & POLLIN) {
        unsigned char sig = 0;
        while (::read(signals.pipe_fds[0], &sig, 1) == 1) {
          if (sig != SIGCHLD) stops.on_signal(sig, opts, say);  // SIGCHLD: reaped below
        }
      }
    }
    // Every child that ended, then what it means, in this order: a task the
    // job cannot lose (so that the worker whose loss made the chief fail is
    // the one named), the chief, then survivable tasks (not started again
    // when they followed the chief).
    std::vector<running*> ended;
    for (auto& r : rs)
      if (r.alive && reap(r)) ended.push_back(&r);
    for (running* r : ended) {
      if (r->spec->chief || r->spec->survivable || ok(r->status) || stopping) continue;
      if (chief_ended) {
        say(who(*r) + " " + describe(r->status) + " after the chief ended");
      } else {
        failure = who(*r) + " " + describe(r->status);
        say(*failure + (r->spec->why_fatal.empty() ? "" : "; " + r->spec->why_fatal) +
            "; stopping the other tasks");
        stop_all(SIGTERM);
      }
    }
    for (running* r : ended) {
      if (r != chief) continue;
      chief_ended = true;
      if (stopping) continue;
      chief_on_its_own = true;
      if (!ok(r->status)) {
        failure = who(*r) + " " + describe(r->status);
        say(*failure + "; the job ends with the chief: stopping the other tasks");
        stop_all(SIGTERM);
      } else if (any_alive()) {
        after_chief_at =
            clock::now() + std::chrono::duration_cast<clock::duration>(
                               std::chrono::duration<double>(opts.after_chief_seconds));
      }
    }
    for (running* r : ended) {
      if (r == chief || !r->spec->survivable || ok(r->status) || stopping) continue;
      if (chief_ended) {
        say(who(*r) + " " + describe(r->status) + " after the chief ended");
        continue;
      }
      std::string line = who(*r) + " " + describe(r->status) + "; the job goes on without it";
      if (restarts >= opts.restart_workers) {
        if (opts.restart_workers > 0)
          line += " (no restarts left: " + std::to_string(restarts) + " of " +
                  std::to_string(opts.restart_workers) + " used)";
        say(line);
        continue;
      }
      say(line);
      ++restarts;
      say("restarting task " + r->spec->name + " (restart " + std::to_string(restarts) + " of " +
          std::to_string(opts.restart_workers) + ")");
      // What the old process left in its pipes comes first.
      for (stream* s : {&r->out, &r->err})
        if (s->fd >= 0) {
          drain(*s, r->prefix);
          close_stream(*s, r->prefix);
        }
      if (!start_one(*r)) say("the job goes on without task " + r->spec->name);
    }
    if (after_chief_at && !stopping && any_alive() && clock::now() >= *after_chief_at) {
      say("tasks still running " + fmt_seconds(opts.after_chief_seconds) +
          " s after the chief ended; stopping them");
      stop_all(SIGTERM);
    }
    if (stopping && !killed && any_alive() && clock::now() >= kill_at) {
      say("tasks still running after " + fmt_seconds(opts.grace_seconds) + " s; sending SIGKILL");
      stop_all(SIGKILL);
    }
  }
  for (auto& r : rs) {
    close_stream(r.out, r.prefix);
    close_stream(r.err, r.prefix);
  }

  int rc = 1;
  if (interrupted_by && !failure) {
    // A chief that left with its checkpoint says "resume me" (75), one that
    // had nothing to keep 128 + the signal: the launcher says the same.
    rc = interrupted_status(rs, chief);
  } else if (chief) {
    if (chief_on_its_own) rc = WIFEXITED(chief->status) ? WEXITSTATUS(chief->status) : 1;
  } else if (!failure) {
    rc = 0;
    for (const auto& r : rs)
      if (!ok(r.status)) rc = 1;
  }
  if (rc == 0) return 0;
  for (const auto& r : rs) {
    if (r.pid < 0) continue;
    std::string line = who(r) + " " + describe(r.status);
    if (failure && *failure == line) continue;
    if (!ok(r.status)) say("  " + line);
  }
  if (failure)
    say(*failure);
  else if (interrupted_by)
    say("interrupted by " + signal_name(interrupted_by) + "; stopped all tasks; exit status " +
        std::to_string(rc) + (chief ? " (the chief's)" : " (the tasks')"));
  return rc;
}

void apply_failure_policy(std::vector<child>& children, const job_config& job) {
  auto rules = find_strategy_rules(job.strategy.kind);
  const bool survives = rules && rules->survives_lost_workers();
  std::vector<task_placement> placement;
  try {
    placement = resolve_placement(job);
  } catch (const std::exception&) {
    // A bad placement: every node reports it and exits 2.
  }
  for (auto& c : children) {
    task_id t;
    try {
      t = parse_task_name(c.name);
    } catch (const std::exception&) {
      continue;
    }
    c.chief = t.job == "chief";
    if (c.chief) continue;
    bool shards = false;
    for (const auto& p : placement)
      if (p.task == t) shards = !p.shards.empty();
    if (!survives)
      c.why_fatal = "the " + job.strategy.kind + " strategy does not go on without a task";
    else if (shards)
      c.why_fatal = "the job does not go on without it: it hosts variable shards";
    else
      c.survivable = t.job == "worker";
  }
}

std::vector<child> node_children(const cluster_spec& spec, const std::string& config_file,
                                 const launch_options& opts) {
  std::vector<std::string> base;
  const char* env_cmd = std::getenv("TROUPE_LAUNCH_NODE_CMD");
  if (env_cmd && *env_cmd)
    base = {"/bin/sh", "-c", std::string(env_cmd) + " \"$@\"", "troupe-node"};
  else if (!opts.node_command.empty())
    base = opts.node_command;
  else
    base = {self_exe(), "node"};
  std::vector<child> out;
  for (const auto& task : all_tasks(spec)) {
    child c;
    c.name = task.str();
    c.argv = base;
    for (const char* a : {"--config", config_file.c_str(), "--task", c.name.c_str()})
      c.argv.emplace_back(a);
    if (!opts.output_dir.empty()) {
      c.argv.emplace_back("--output");
      c.argv.push_back(opts.output_dir);
    }
    if (opts.resume) c.argv.emplace_back("--resume");
    if (opts.overwrite) c.argv.emplace_back("--overwrite");
    c.argv.insert(c.argv.end(), opts.extra_args.begin(), opts.extra_args.end());
    c.env = {"TROUPE_TASK=" + c.name};
    out.push_back(std::move(c));
  }
  return out;
}

int cmd_launch(const std::vector<std::string>& args,
               const std::function<int(const std::string&)>& bad_usage) {
  std::string file;
  launch_options opts;
  const std::string restarts_needed =
      "--restart-workers needs the number of restarts (0 to " + std::to_string(kMaxRestarts) + ")";
  const auto take_restarts = [&](const std::string& v) {
    std::size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(v, &used, 10);
    } catch (const std::exception&) {
      used = 0;
    }
    if (v.empty() || used != v.size() || !std::isdigit(static_cast<unsigned char>(v[0])) || n < 0 ||
        n > kMaxRestarts)
      return restarts_needed + ", got '" + v + "'";
    opts.restart_workers = static_cast<int>(n);
    return std::string();
  };
  cli::option_parser options("launch");
  options.config_file(file, true, "launch needs a config file (--config FILE)")
      .rest_after_dashes(opts.extra_args)
      .value("--output", opts.output_dir, "--output needs a directory")
      .value("--restart-workers", take_restarts, restarts_needed)
      .flag("--resume", opts.resume)
      .flag("--overwrite", opts.overwrite)
      .exclusive("--resume", "--overwrite");
  if (auto why = options.parse(args)) return bad_usage(*why);
  job_config cfg;
  try {
    cfg = load_job_config(file);
  } catch (const config_error& e) {
    std::cerr << "troupe: " << (e.path().empty() ? "" : file + ": ") << e.what() << "\n";
    return 2;
  }
  if (!cfg.cluster) {
    std::cerr << "troupe: " << file
              << ": no \"cluster\" section; troupe launch starts the tasks of a cluster spec "
                 "(\"cluster\": {\"tasks\": {\"chief\": [\"127.0.0.1:7000\"], ...}}); use "
                 "troupe run for a single-process job\n";
    return 2;
  }
  if (cfg.cluster->tasks.empty()) {
    std::cerr << "troupe: " << file
              << ": cluster.tasks: missing; troupe launch starts the tasks a cluster spec lists "
                 "(a cluster from the environment is started by its launcher: torchrun, "
                 "Kubernetes, srun)\n";
    return 2;
  }
  auto children = node_children(*cfg.cluster, file, opts);
  apply_failure_policy(children, cfg);
  bool survivable = false;
  std::string why_not;
  for (const auto& c : children) {
    survivable = survivable || c.survivable;
    if (why_not.empty()) why_not = c.why_fatal;
  }
  if (opts.restart_workers > 0 && !survivable)
    std::cerr << "troupe launch: --restart-workers has no effect: the job cannot lose any task"
              << (why_not.empty() ? "" : " (" + why_not + ")") << "\n";
  // Every task runs here, so a secret made up now serves them all; it reaches
  // them through the environment, never the command line.
  const auto& spec = *cfg.cluster;
  const char* given = std::getenv(spec.secret_env.c_str());
  if (spec.secret_file.empty() && (!given || !*given)) {
    auto secret = make_challenge();
    for (auto& c : children) c.env.push_back(spec.secret_env + "=" + secret);
    std::cerr << "troupe launch: $" << spec.secret_env
              << " is not set: the tasks share a secret made up for this launch\n";
  }
  std::string names;
  for (const auto& c : children) {
    if (!names.empty()) names += ", ";
    names += c.name + " (" + task_address(*cfg.cluster, parse_task_name(c.name)) + ")";
  }
  std::cerr << "troupe launch: starting " << children.size() << " tasks: " << names << "\n";
  std::cerr.flush();
  std::cout.flush();
  supervise_options so;
  so.restart_workers = opts.restart_workers;
  // A task asked to stop while training takes up to cluster.grace_seconds to
  // leave with its checkpoint; SIGKILL only after that.
  so.signal_grace_seconds = spec.grace_seconds + 5;
  so.log_starts = true;
  return supervise(children, so);
}

}  // namespace troupe::launch
