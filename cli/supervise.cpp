// supervise(): the launcher's child processes, their output and their ends.
#include "cli/supervise.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "net/launch_enrol.hpp"
#include "runtime/stop_policy.hpp"

namespace troupe::launch {
namespace {

using clock = std::chrono::steady_clock;

constexpr std::size_t kMaxLine = 64 << 10;  // a longer line is relayed in pieces

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
  int enrol_fd = -1;  // the launcher's end of this start's enrolment socket
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

// The launcher's environment with the child's additions; an inherited
// TROUPE_ENROL_FD never passes on, this start's (enrol_fd >= 0) does.
std::vector<std::string> child_environment(const child& c, int enrol_fd) {
  std::vector<std::string> adds = c.env;
  const std::string enrol_key = std::string(launch_enrol::kFdVariable) + "=";
  adds.push_back(enrol_key);  // only filters the inherited one
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    bool overridden = false;
    for (const auto& x : adds) {
      auto eq = x.find('=');
      if (kv.compare(0, eq + 1, x, 0, eq + 1) == 0) overridden = true;
    }
    if (!overridden) out.push_back(std::move(kv));
  }
  for (const auto& x : c.env) out.push_back(x);
  if (enrol_fd >= 0) out.push_back(enrol_key + std::to_string(enrol_fd));
  return out;
}

// The socket pair for one start's enrolment: [0] the launcher's
// (non-blocking), [1] the child's, above stderr so the child's dup2 of its
// standard streams cannot replace it; both close-on-exec until the child
// clears it on its own end. False (with `why`) when it cannot be made.
bool enrol_sockets(int (&fds)[2], std::string& why) {
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    why = std::string("socketpair: ") + std::strerror(errno);
    fds[0] = fds[1] = -1;
    return false;
  }
  if (fds[1] <= 2) {
    int high = ::fcntl(fds[1], F_DUPFD_CLOEXEC, 3);
    ::close(fds[1]);
    fds[1] = high;
  }
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  if (fds[1] < 0) {
    why = std::string("fcntl: ") + std::strerror(errno);
    ::close(fds[0]);
    fds[0] = -1;
    return false;
  }
  return true;
}

// fork + exec of one child, its stdout/stderr on fresh pipes. Returns false
// (with `why`) when it could not be started at all.
bool start(running& r, int out_to, int err_to, bool with_enrol, std::string& why) {
  const child& c = *r.spec;
  if (c.argv.empty()) {
    why = "no command for task " + c.name;
    return false;
  }
  if (r.enrol_fd >= 0) ::close(r.enrol_fd);
  r.enrol_fd = -1;
  int enrol[2] = {-1, -1};
  if (with_enrol && !enrol_sockets(enrol, why)) return false;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    why = std::string("pipe: ") + std::strerror(errno);
    for (int fd : enrol)
      if (fd >= 0) ::close(fd);
    return false;
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    why = std::string("pipe: ") + std::strerror(errno);
    for (int fd : {out[0], out[1], enrol[0], enrol[1]})
      if (fd >= 0) ::close(fd);
    return false;
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : c.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const auto env_store = child_environment(c, enrol[1]);
  std::vector<char*> envp;
  for (const auto& e : env_store) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exec_failed = "troupe launch: cannot run " + c.argv[0] + ": ";
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    why = std::string("fork: ") + std::strerror(errno);
    for (int fd : {out[0], out[1], err[0], err[1], enrol[0], enrol[1]})
      if (fd >= 0) ::close(fd);
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
    if (enrol[1] >= 0) ::fcntl(enrol[1], F_SETFD, 0);  // this one end passes the exec
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
  if (enrol[1] >= 0) ::close(enrol[1]);
  r.enrol_fd = enrol[0];
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
  if (r.enrol_fd >= 0) ::close(r.enrol_fd);  // it never asked: nobody will
  r.enrol_fd = -1;
  return true;
}

clock::time_point after_seconds(double s) {
  return clock::now() +
         std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(s));
}

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

bool exited_zero(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string who(const running& r) {
  return "task " + r.spec->name + " (pid " + std::to_string(r.pid) + ")";
}

// Milliseconds from now until `t` (at least 0), for poll().
int ms_until(clock::time_point t) {
  return static_cast<int>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(t - clock::now()).count() + 1));
}

// One run of supervise(): the children, what has happened to them, and one
// handler per event (a child's output, a signal to the launcher, a child's
// end, a deadline passed). Its lifecycle:
//
//   running --chief exited 0--> following_chief --> stopping --> killing
//      \________________________________________/^
//        a task the job cannot lose ended, a signal, a deadline
//
// and whatever the phase, once no child is alive: a short while for the
// output still in the pipes, then the exit status.
class supervisor {
 public:
  supervisor(const std::vector<child>& children, const supervise_options& opts, int signal_fd)
      : opts_(opts), signal_fd_(signal_fd), rs_(children.size()) {
    for (std::size_t i = 0; i < children.size(); ++i) {
      rs_[i].spec = &children[i];
      rs_[i].prefix = "[" + children[i].name + "] ";
      if (children[i].chief && !chief_) chief_ = &rs_[i];
    }
  }

  int run() {
    start_all();
    while (wait_for_events()) {
      on_children_ended(reap_ended());
      check_deadlines();
    }
    for (auto& r : rs_) {
      close_stream(r.out, r.prefix);
      close_stream(r.err, r.prefix);
    }
    const int rc = exit_status();
    if (rc != 0) report(rc);
    return rc;
  }

 private:
  enum class phase {
    running,          // every task as started
    following_chief,  // the chief exited 0; the others have after_chief_seconds to end
    stopping,         // the others got a signal; SIGKILL at kill_at_
    killing,          // they got SIGKILL
  };

  // A pipe poll() watches: the signal pipe (task == nullptr) or a child's stream.
  struct watched {
    stream* s = nullptr;
    running* task = nullptr;
  };

  void say(const std::string& line) const {
    write_all(opts_.err_fd, "troupe launch: " + line + "\n");
  }

  bool stopping() const { return phase_ >= phase::stopping; }

  bool any_alive() const {
    for (const auto& r : rs_)
      if (r.alive) return true;
    return false;
  }

  // A signal to every task alive; the deadline for SIGKILL when it is the first.
  void stop_all(int sig, double grace_seconds) {
    for (auto& r : rs_)
      if (r.alive) ::kill(-r.pid, sig);
    if (!stopping()) kill_at_ = after_seconds(grace_seconds);
    if (sig == SIGKILL)
      phase_ = phase::killing;
    else if (!stopping())
      phase_ = phase::stopping;
  }
  void stop_all(int sig) { stop_all(sig, opts_.grace_seconds); }

  bool start_one(running& r) {
    std::string why;
    if (!start(r, opts_.out_fd, opts_.err_fd, static_cast<bool>(opts_.enrol), why)) {
      say("cannot start task " + r.spec->name + ": " + why);
      return false;
    }
    if (opts_.log_starts) say(who(r) + " started");
    return true;
  }

  void start_all() {
    for (auto& r : rs_) {
      if (!start_one(r)) {
        failure_ = "task " + r.spec->name + " could not be started";
        stop_all(SIGTERM);
        return;
      }
    }
  }

  // Waits for output, a signal or the next deadline, and handles what came.
  // False once every child is reaped and its output relayed (or the time
  // for that is up).
  bool wait_for_events() {
    if (!any_alive() && !drain_until_) drain_until_ = clock::now() + std::chrono::milliseconds(500);
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
    std::vector<watched> owners{{}};
    for (auto& r : rs_)
      for (stream* s : {&r.out, &r.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back({s, &r});
        }
    for (auto& r : rs_)
      if (r.enrol_fd >= 0) {
        fds.push_back({r.enrol_fd, POLLIN, 0});
        owners.push_back({nullptr, &r});
      }
    if (drain_until_ && (fds.size() == 1 || clock::now() >= *drain_until_)) return false;
    int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    if (n < 0 && errno != EINTR) on_poll_error();
    if (n <= 0) return true;
    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents && owners[i].s)
        drain(*owners[i].s, owners[i].task->prefix);
      else if (fds[i].revents)
        answer_enrolment(*owners[i].task);
    if (fds[0].revents & POLLIN) read_signals();
    return true;
  }

  // The first message on a start's enrolment socket, answered by
  // opts_.enrol; then the socket is closed (one answer per start).
  void answer_enrolment(running& r) {
    std::string message(launch_enrol::kFrameBytes + 1, '\0');
    ssize_t n = ::recv(r.enrol_fd, message.data(), message.size(), MSG_TRUNC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n > 0) {
      message.resize(std::min(message.size(), static_cast<std::size_t>(n)));
      std::string refusal;
      const auto reply = opts_.enrol(*r.spec, message, refusal);
      [[maybe_unused]] auto sent =
          ::send(r.enrol_fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (refusal.empty())
        say(who(r) + " enrolled: the job CA issued its certificate as " + r.spec->name);
      else
        say(who(r) + ": certificate request refused: " + refusal);
    }
    ::close(r.enrol_fd);
    r.enrol_fd = -1;
  }

  // Until the next deadline of the current phase; -1: none.
  int poll_timeout_ms() const {
    if (drain_until_) return ms_until(*drain_until_);
    switch (phase_) {
      case phase::running:
        return -1;
      case phase::following_chief:
        return ms_until(after_chief_at_);
      case phase::stopping:
        return ms_until(kill_at_);
      case phase::killing:
        return 100;  // SIGKILLed: reap soon
    }
    return -1;
  }

  void read_signals() {
    unsigned char sig = 0;
    while (::read(signal_fd_, &sig, 1) == 1)
      if (sig != SIGCHLD) on_signal(sig);  // SIGCHLD: reaped after the wait
  }

  void on_poll_error() {
    say(std::string("poll: ") + std::strerror(errno));
    stop_all(SIGKILL);
  }

  // A signal to the launcher, forwarded: the tasks apply the signal policy
  // (runtime/stop_policy.hpp): the first stops them (at their next update
  // with a checkpoint when training), a second SIGINT/SIGTERM at once; a
  // third kills them.
  void on_signal(int sig) {
    if (!stopping()) {
      interrupted_by_ = sig;
      say("got " + signal_name(sig) + "; stopping all tasks (forwarded to each)");
      stop_all(sig, opts_.signal_grace_seconds);
    } else if (sig == SIGUSR1 || phase_ == phase::killing) {
      return;
    } else if (!forwarded_again_) {
      forwarded_again_ = true;
      say("got " + signal_name(sig) + " again; forwarded: every task stops at once");
      stop_all(sig, 0);
      kill_at_ = std::min(kill_at_, after_seconds(2));
    } else {
      say("got " + signal_name(sig) + " a third time; killing all tasks");
      stop_all(SIGKILL, 0);
    }
  }

  std::vector<running*> reap_ended() {
    std::vector<running*> ended;
    for (auto& r : rs_)
      if (r.alive && reap(r)) ended.push_back(&r);
    return ended;
  }

  // What the ends mean, in this order: a task the job cannot lose (so that
  // the worker whose loss made the chief fail is the one named), the chief,
  // then survivable tasks (not started again when they followed the chief).
  void on_children_ended(const std::vector<running*>& ended) {
    for (running* r : ended)
      if (!r->spec->chief && !r->spec->survivable) on_essential_task_ended(*r);
    for (running* r : ended)
      if (r == chief_) on_chief_ended(*r);
    for (running* r : ended)
      if (r != chief_ && r->spec->survivable) on_survivable_task_ended(*r);
  }

  void on_essential_task_ended(running& r) {
    if (exited_zero(r.status) || stopping()) return;
    if (phase_ == phase::following_chief) {
      say(who(r) + " " + describe(r.status) + " after the chief ended");
      return;
    }
    failure_ = who(r) + " " + describe(r.status);
    say(*failure_ + (r.spec->why_fatal.empty() ? "" : "; " + r.spec->why_fatal) +
        "; stopping the other tasks");
    stop_all(SIGTERM);
  }

  void on_chief_ended(running& r) {
    if (stopping()) return;
    chief_on_its_own_ = true;
    if (!exited_zero(r.status)) {
      failure_ = who(r) + " " + describe(r.status);
      say(*failure_ + "; the job ends with the chief: stopping the other tasks");
      stop_all(SIGTERM);
      return;
    }
    phase_ = phase::following_chief;
    after_chief_at_ = after_seconds(opts_.after_chief_seconds);
  }

  void on_survivable_task_ended(running& r) {
    if (exited_zero(r.status) || stopping()) return;
    if (phase_ == phase::following_chief) {
      say(who(r) + " " + describe(r.status) + " after the chief ended");
      return;
    }
    std::string line = who(r) + " " + describe(r.status) + "; the job goes on without it";
    if (restarts_ >= opts_.restart_workers) {
      if (opts_.restart_workers > 0)
        line += " (no restarts left: " + std::to_string(restarts_) + " of " +
                std::to_string(opts_.restart_workers) + " used)";
      say(line);
      return;
    }
    say(line);
    restart(r);
  }

  void restart(running& r) {
    ++restarts_;
    say("restarting task " + r.spec->name + " (restart " + std::to_string(restarts_) + " of " +
        std::to_string(opts_.restart_workers) + ")");
    // What the old process left in its pipes comes first.
    for (stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        drain(*s, r.prefix);
        close_stream(*s, r.prefix);
      }
    if (!start_one(r)) say("the job goes on without task " + r.spec->name);
  }

  void check_deadlines() {
    if (phase_ == phase::following_chief && any_alive() && clock::now() >= after_chief_at_)
      on_after_chief_timeout();
    if (phase_ == phase::stopping && any_alive() && clock::now() >= kill_at_) on_grace_timeout();
  }

  void on_after_chief_timeout() {
    say("tasks still running " + fmt_seconds(opts_.after_chief_seconds) +
        " s after the chief ended; stopping them");
    stop_all(SIGTERM);
  }

  void on_grace_timeout() {
    say("tasks still running after " + fmt_seconds(opts_.grace_seconds) + " s; sending SIGKILL");
    stop_all(SIGKILL);
  }

  int exit_status() const {
    // A chief that left with its checkpoint says "resume me" (75), one that
    // had nothing to keep 128 + the signal: the launcher says the same.
    if (interrupted_by_ && !failure_) return interrupted_status(rs_, chief_);
    if (chief_)
      return chief_on_its_own_ && WIFEXITED(chief_->status) ? WEXITSTATUS(chief_->status) : 1;
    if (failure_) return 1;
    for (const auto& r : rs_)
      if (!exited_zero(r.status)) return 1;
    return 0;
  }

  // Every task that did not exit 0, then why the job ended.
  void report(int rc) const {
    for (const auto& r : rs_) {
      if (r.pid < 0) continue;
      std::string line = who(r) + " " + describe(r.status);
      if (failure_ && *failure_ == line) continue;
      if (!exited_zero(r.status)) say("  " + line);
    }
    if (failure_)
      say(*failure_);
    else if (interrupted_by_)
      say("interrupted by " + signal_name(interrupted_by_) + "; stopped all tasks; exit status " +
          std::to_string(rc) + (chief_ ? " (the chief's)" : " (the tasks')"));
  }

  const supervise_options& opts_;
  const int signal_fd_;  // the read end of the signal self-pipe
  std::vector<running> rs_;
  running* chief_ = nullptr;
  phase phase_ = phase::running;
  clock::time_point kill_at_{};                   // stopping: SIGKILL then
  clock::time_point after_chief_at_{};            // following_chief: SIGTERM then
  std::optional<clock::time_point> drain_until_;  // no child alive: relay output until then
  bool forwarded_again_ = false;                  // a second signal was forwarded
  int interrupted_by_ = 0;              // the signal the launcher got, if one stopped the job
  std::optional<std::string> failure_;  // the first task that failed, and how
  int restarts_ = 0;                    // survivable tasks started again, in all
  bool chief_on_its_own_ = false;       // the chief ended before the launcher stopped anything
};

}  // namespace

int supervise(const std::vector<child>& children, const supervise_options& opts) {
  signal_scope signals;
  if (!signals.ok) {
    write_all(opts.err_fd,
              std::string("troupe launch: cannot create a pipe: ") + std::strerror(errno) + "\n");
    return 1;
  }
  return supervisor(children, opts, signals.pipe_fds[0]).run();
}

}  // namespace troupe::launch
