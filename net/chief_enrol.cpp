// Enrolment of tasks started by hand with the chief's job CA
// (net/chief_enrol.hpp).
#include "net/chief_enrol.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "net/gate.hpp"
#include "net/launch_enrol.hpp"
#include "net/rendezvous.hpp"
#include "net/socket.hpp"

namespace troupe::chief_enrol {

namespace {

using clock_type = std::chrono::steady_clock;

// How long an admitted connection has to send its request.
constexpr auto kRequestTimeout = std::chrono::seconds(5);
// Connections past the gate that have not sent their request yet; one more
// closes the oldest (only holders of the secret get this far).
constexpr std::size_t kMaxPending = 64;

}  // namespace

std::string door_of(const std::string& chief) {
  return chief + "/enrol";
}

struct desk::state {
  std::string chief;
  std::function<bool(const std::string&)> is_live;
  job_authority ca;  // in memory for the whole job, never written anywhere
  net::reactor loop;
  std::atomic<bool> stopping{false};

  struct connection {
    int fd = -1;
    std::string name, peer;
    std::string frame;  // the request, filled as bytes arrive
    std::size_t got = 0;
    clock_type::time_point deadline;
  };
  std::mutex incoming_mutex;
  std::deque<connection> incoming;         // from the gate's thread
  std::deque<connection> pending;          // admitted, request not whole yet
  std::map<std::string, connection> held;  // enrolled, connection open

  mutable std::mutex stats_mutex;
  desk_stats stats;

  void count(uint64_t desk_stats::*field) {
    std::lock_guard<std::mutex> guard(stats_mutex);
    ++(stats.*field);
  }

  void refuse(connection& c, const std::string& why, bool tell) {
    count(&desk_stats::refused);
    spdlog::warn("{}: enrolment: refused a certificate for {} ({}): {}", chief, c.name, c.peer,
                 why);
    if (tell)
      net::send_all(c.fd, rendezvous_wire::make_reply({{"error", why}}),
                    clock_type::now() + std::chrono::milliseconds(500));
    ::close(c.fd);
    c.fd = -1;
  }

  // Why `name` may not be issued a certificate now, or "".
  std::string held_reason(const std::string& name) const {
    if (name == chief) return "the chief's own name is never issued";
    if (auto h = held.find(name); h != held.end())
      return name + " is live: it enrolled from " + h->second.peer +
             " and that connection is open; a live task's name is not issued again";
    if (is_live(name))
      return name + " is live: it has a link to " + chief +
             "; a live task's name is not issued again";
    return "";
  }

  void settle(connection& c) {
    std::string why = held_reason(c.name);
    std::string reply;
    if (why.empty()) reply = launch_enrol::answer(ca, c.name, c.frame, why);
    if (!why.empty()) return refuse(c, why, true);
    if (!net::send_all(c.fd, reply, clock_type::now() + std::chrono::seconds(5))) {
      spdlog::warn("{}: enrolment: {} ({}) left before its certificate was sent", chief, c.name,
                   c.peer);
      ::close(c.fd);
      c.fd = -1;
      return;
    }
    count(&desk_stats::issued);
    spdlog::info("{}: enrolment: issued {} ({}) its certificate from the job CA", chief, c.name,
                 c.peer);
    const auto name = c.name;
    held[name] = std::move(c);
    c.fd = -1;
  }

  // Reads what `c` sent; false once it is settled (whole, or closed).
  bool read_some(connection& c) {
    const ssize_t n = ::recv(c.fd, c.frame.data() + c.got, c.frame.size() - c.got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (n <= 0) {
      refuse(c, n == 0 ? "it closed the connection before its request" : std::strerror(errno),
             false);
      return false;
    }
    c.got += static_cast<std::size_t>(n);
    if (c.got < c.frame.size()) return true;
    settle(c);
    return false;
  }

  void take_incoming() {
    std::deque<connection> arrived;
    {
      std::lock_guard<std::mutex> guard(incoming_mutex);
      arrived.swap(incoming);
    }
    for (auto& c : arrived) {
      if (pending.size() >= kMaxPending) {
        refuse(pending.front(), "too many enrolments at once (the oldest closed)", false);
        pending.pop_front();
      }
      pending.push_back(std::move(c));
    }
  }

  // A task sends nothing after its request: a held connection that became
  // readable has closed (or broken the protocol), and its name is free
  // unless its link to the chief is up.
  void release(const std::string& name) {
    auto h = held.find(name);
    spdlog::info("{}: enrolment: {} ({}) closed its enrolment connection", chief, name,
                 h->second.peer);
    ::close(h->second.fd);
    held.erase(h);
  }

  void turn() {
    take_incoming();
    loop.clear();
    auto until = clock_type::now() + std::chrono::seconds(1);
    for (const auto& c : pending) {
      loop.watch(c.fd, POLLIN);
      until = std::min(until, c.deadline);
    }
    std::vector<std::string> held_names;
    for (const auto& [name, c] : held) {
      loop.watch(c.fd, POLLIN);
      held_names.push_back(name);
    }
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(until - clock_type::now());
    if (loop.wait(static_cast<int>(std::max<int64_t>(wait.count(), 0))) < 0 && errno != EINTR)
      throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));
    const auto now = clock_type::now();
    std::deque<connection> still;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      auto& c = pending[i];
      if (loop.revents(i) != 0 ? read_some(c) : c.deadline > now)
        still.push_back(std::move(c));
      else if (c.fd >= 0)
        refuse(c, "no request within 5 s", false);
    }
    for (std::size_t k = 0; k < held_names.size(); ++k)
      if (loop.revents(pending.size() + k) != 0) release(held_names[k]);
    pending = std::move(still);
  }

  void close_all() {
    for (auto* q : {&incoming, &pending})
      for (auto& c : *q)
        if (c.fd >= 0) ::close(c.fd);
    for (auto& [name, c] : held) ::close(c.fd);
  }
};

desk::desk(std::string chief, std::function<bool(const std::string&)> is_live)
    : st_(std::make_unique<state>()) {
  st_->chief = std::move(chief);
  st_->is_live = std::move(is_live);
  if (!st_->loop.problem().empty())
    throw job_ca_error(st_->chief + ": enrolment: " + st_->loop.problem());
  thread_ = std::thread([st = st_.get()] {
    try {
      while (!st->stopping) st->turn();
    } catch (const std::exception& e) {
      // Nothing a peer sends throws; poll failing does. Tasks then cannot
      // enrol, and their join deadlines name the chief.
      spdlog::error("{}: enrolment stopped: {}", st->chief, e.what());
    }
  });
}

desk::~desk() {
  st_->stopping = true;
  st_->loop.wake();
  if (thread_.joinable()) thread_.join();
  st_->close_all();
}

task_identity desk::issue_self() const {
  return st_->ca.issue_self(st_->chief);
}

void desk::add(int fd, const std::string& name, const std::string& peer) {
  state::connection c;
  c.fd = fd;
  c.name = name;
  c.peer = peer;
  c.frame.assign(launch_enrol::kFrameBytes, '\0');
  c.deadline = clock_type::now() + kRequestTimeout;
  {
    std::lock_guard<std::mutex> guard(st_->incoming_mutex);
    st_->incoming.push_back(std::move(c));
  }
  st_->loop.wake();
}

desk_stats desk::stats() const {
  std::lock_guard<std::mutex> guard(st_->stats_mutex);
  return st_->stats;
}

namespace {

// The request on `fd` (past the door) and the chief's answer, by `by`: the
// identity, or "" with `problem` saying why not.
task_identity ask(int fd, const std::string& frame, const std::string& task, const task_key& key,
                  clock_type::time_point by, std::string& problem) {
  auto r = request_reply(fd, frame, by);
  switch (r.state) {
    case chief_reply::status::ok:
      return launch_enrol::identity_of_reply(r.payload, task, key, problem);
    case chief_reply::status::malformed:
      problem = "sent a malformed answer";
      return {};
    default:
      problem = "sent no answer: " + (r.why.empty() ? std::string("closed the connection") : r.why);
      return {};
  }
}

}  // namespace

enrolment enrol(const std::string& secret, const std::string& task, const std::string& chief,
                const std::string& host, uint16_t port, clock_type::time_point deadline) {
  const std::string where = host + ":" + std::to_string(port);
  // One key per incarnation: its private half never leaves this process.
  const task_key key;
  const auto frame = launch_enrol::make_frame(task, key);
  gate_options o;
  o.secret = secret;
  o.name = task;
  o.expect_peer = door_of(chief);
  std::string last, refusal;
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    const auto left = std::chrono::duration_cast<caf::timespan>(deadline - clock_type::now());
    auto s = gate_secure_handshake(
        host, port, o,
        std::clamp<caf::timespan>(left, std::chrono::milliseconds(100), std::chrono::seconds(10)));
    if (s.fd >= 0) {
      std::string problem;
      auto id = ask(s.fd, frame, task, key,
                    std::min(deadline, clock_type::now() + std::chrono::seconds(10)), problem);
      if (problem.empty()) return {std::move(id), s.fd};
      ::close(s.fd);
      // A predecessor's connection may still be closing: retried too.
      refusal = last = chief + " at " + where + " " + problem;
    } else if (!s.unreachable) {
      throw job_ca_error(task + ": enrolling with " + chief + " failed: " + s.error);
    } else {
      last = s.error;
      if (gate_wire::names_refusal(last)) refusal = last;
    }
    if (clock_type::now() + backoff >= deadline)
      throw job_ca_error(task + ": cannot enrol with " + chief + " at " + where +
                         " for its certificate before the join deadline "
                         "(cluster.join_timeout_seconds): " +
                         last +
                         (refusal.empty() || refusal == last ? "" : "; before that: " + refusal));
    spdlog::debug("{}: enrolling with {} at {}: {}; again in {} ms", task, chief, where, last,
                  backoff.count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(2 * backoff, std::chrono::seconds(1));
  }
}

}  // namespace troupe::chief_enrol
