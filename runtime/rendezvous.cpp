// The rendezvous at the chief (see rendezvous.hpp).
#include "runtime/rendezvous.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "actors/job_options.hpp"
#include "config/secret.hpp"
#include "runtime/gate.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;
using seconds_d = std::chrono::duration<double>;

// The name the chief's rendezvous gate proves: a rank that reaches the
// chief's node instead (the rendezvous is over) must not speak to it, as
// those bytes would go to BASP.
constexpr const char* kRendezvousGate = "chief:0/rendezvous";

// How long the chief gives an admitted peer to send its announce.
constexpr auto kAnnounceTimeout = std::chrono::seconds(5);

std::string rank_name(int64_t rank) {
  return "rank:" + std::to_string(rank);
}

// A connection that passed the chief's gate, handed over from the gate's
// thread to the rendezvous on the main thread.
struct admitted {
  int fd;
  std::string name;
  std::string peer;
};

class admitted_queue {
 public:
  void push(admitted a) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(a));
    }
    cv_.notify_all();
  }
  std::optional<admitted> pop_until(clock_type::time_point deadline) {
    std::unique_lock<std::mutex> g(mu_);
    if (!cv_.wait_until(g, deadline, [&] { return !q_.empty(); })) return std::nullopt;
    auto a = std::move(q_.front());
    q_.pop_front();
    return a;
  }
  // Closes what arrived after the rendezvous was over.
  ~admitted_queue() {
    for (auto& a : q_) ::close(a.fd);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<admitted> q_;
};

// A rank that announced itself and waits for the cluster.
struct announced {
  int fd;
  std::string address;
  std::string peer;
};

void answer_and_close(int fd, const nlohmann::json& payload) {
  socket_io::send_all(fd, rendezvous_wire::make_reply(payload),
                      clock_type::now() + std::chrono::seconds(5));
  ::close(fd);
}

// The chief's check of one admitted connection: its announce, then whether
// its rank and address are still free. Refused peers are told why and logged.
void take_announce(const admitted& a, int64_t world_size, std::map<int64_t, announced>& ranks,
                   const std::string& chief_address) {
  std::string frame(rendezvous_wire::kAnnounceBytes, '\0');
  std::string why;
  if (!socket_io::recv_exact(a.fd, frame, clock_type::now() + kAnnounceTimeout, &why)) {
    spdlog::warn("chief:0: rendezvous: {} ({}) sent no announce: {}", a.name, a.peer, why);
    ::close(a.fd);
    return;
  }
  auto check = rendezvous_wire::check_announce(frame, world_size);
  if (check.problem.empty()) {
    if (auto taken = ranks.find(check.rank); taken != ranks.end())
      check.problem =
          "rank " + std::to_string(check.rank) + " already joined from " + taken->second.peer;
    for (const auto& [r, other] : ranks)
      if (check.problem.empty() && other.address == check.address)
        check.problem = "its address " + check.address + " is already rank " + std::to_string(r) +
                        "'s" + (r == 0 ? " (the chief's, " + chief_address + ")" : "");
  }
  if (!check.problem.empty()) {
    spdlog::warn("chief:0: rendezvous: refused {} ({}): {}", a.name, a.peer, check.problem);
    answer_and_close(a.fd, {{"error", check.problem}});
    return;
  }
  spdlog::info("chief:0: rendezvous: rank {} of {} joined, listening at {}", check.rank, world_size,
               check.address);
  ranks[check.rank] = {a.fd, check.address, a.peer};
}

std::string missing_ranks(const std::map<int64_t, announced>& ranks, int64_t world_size) {
  std::string out;
  int64_t listed = 0;
  for (int64_t r = 1; r < world_size; ++r) {
    if (ranks.count(r)) continue;
    if (listed++ == 8) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out;
}

// A port this rank can listen on at `host`: the OS picks a free one. It is
// free again once this returns, until troupe node's gate takes it moments
// later.
uint16_t free_port_at(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "0", &hints, &res); rc != 0)
    throw job_error("cannot listen at " + host +
                    " (TROUPE_ADVERTISE_ADDR or the host name): " + ::gai_strerror(rc));
  uint16_t port = 0;
  std::string last = "no address";
  for (auto* a = res; a != nullptr && port == 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0)
      port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    else
      last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (port == 0) throw job_error("cannot listen at " + host + ": " + last);
  return port;
}

std::string machine_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

}  // namespace

cluster_tasks serve_rendezvous(const std::string& secret, const cluster_env& me, int64_t ps_ranks,
                               seconds_d timeout) {
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(timeout);
  const auto hp = parse_host_port(me.chief);
  admitted_queue arrivals;
  gate_options opts;
  opts.secret = secret;
  opts.name = kRendezvousGate;
  auto door =
      std::make_unique<gate>(hp.host, hp.port, opts,
                             [&arrivals](int fd, const std::string& name, const std::string& peer) {
                               arrivals.push({fd, name, peer});
                             });
  spdlog::info("chief:0: rendezvous at {}: waiting for the {} other rank{}", me.chief,
               me.world_size - 1, me.world_size == 2 ? "" : "s");
  std::map<int64_t, announced> ranks;
  ranks[0] = {-1, me.chief, "this process"};
  while (static_cast<int64_t>(ranks.size()) < me.world_size) {
    auto next = arrivals.pop_until(deadline);
    if (!next) break;
    take_announce(*next, me.world_size, ranks, me.chief);
  }
  door.reset();  // no one else joins; troupe node listens here next
  if (static_cast<int64_t>(ranks.size()) < me.world_size) {
    const auto missing = me.world_size - static_cast<int64_t>(ranks.size());
    const std::string why = (missing == 1 ? "rank " : "ranks ") +
                            missing_ranks(ranks, me.world_size) + " did not join the chief at " +
                            me.chief + " within " + fmt::format("{:g}", timeout.count()) +
                            " s (cluster.join_timeout_seconds)";
    for (auto& [r, a] : ranks)
      if (a.fd >= 0) answer_and_close(a.fd, {{"error", why}});
    throw job_error("chief:0: " + why);
  }
  std::vector<std::string> addresses;
  for (const auto& [r, a] : ranks) addresses.push_back(a.address);
  auto tasks = tasks_of_ranks(addresses, ps_ranks);
  for (auto& [r, a] : ranks)
    if (a.fd >= 0) answer_and_close(a.fd, {{"tasks", tasks}});
  return tasks;
}

cluster_tasks join_rendezvous(const std::string& secret, const cluster_env& me,
                              const std::string& address, seconds_d timeout) {
  const auto limit = std::chrono::duration_cast<clock_type::duration>(timeout);
  const auto deadline = clock_type::now() + limit;
  const auto chief = parse_host_port(me.chief);
  const std::string name = rank_name(me.rank);
  gate_options opts;
  opts.secret = secret;
  opts.name = name;
  auto backoff = std::chrono::milliseconds(100);
  gate_socket s;
  std::string refusal;
  for (;;) {
    const auto left = std::chrono::duration_cast<caf::timespan>(deadline - clock_type::now());
    s = gate_secure_handshake(
        chief.host, chief.port, opts,
        std::clamp<caf::timespan>(left, std::chrono::milliseconds(100), std::chrono::seconds(10)));
    if (s.fd >= 0 && s.peer != kRendezvousGate) {
      ::close(s.fd);
      throw job_error(name + ": " + me.chief + " is " + s.peer +
                      ", not the chief's rendezvous: its job has formed its cluster already");
    }
    if (s.fd >= 0) break;
    if (!s.unreachable)
      throw job_error(name + ": joining the chief at " + me.chief + " failed: " + s.error);
    // A refusal that is not authenticated (a wrong secret on either side, or
    // someone else on the port) is retried; it is the likelier cause if the
    // deadline passes, so it is named then.
    if (gate_wire::names_refusal(s.error)) refusal = s.error;
    if (clock_type::now() + backoff >= deadline)
      throw job_error(name + ": cannot join the chief at " + me.chief + " within " +
                      fmt::format("{:g}", timeout.count()) +
                      " s (cluster.join_timeout_seconds): " + s.error +
                      (refusal.empty() || refusal == s.error ? "" : "; before that: " + refusal));
    spdlog::debug("{}: the chief at {} is not there yet ({}); again in {} ms", name, me.chief,
                  s.error, backoff.count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(2 * backoff, std::chrono::seconds(2));
  }
  spdlog::info("{}: joined the chief at {}; announced {}, waiting for the other ranks", name,
               me.chief, address);
  // Once announced, the chief answers when every rank is there, or with an
  // error when it gives up (its own join timeout).
  const auto answer_by = clock_type::now() + limit + std::chrono::seconds(5);
  std::string why;
  std::string header(rendezvous_wire::kReplyHeaderBytes, '\0');
  const bool sent = socket_io::send_all(
      s.fd, rendezvous_wire::make_announce(me.rank, me.world_size, address), answer_by);
  if (!sent || !socket_io::recv_exact(s.fd, header, answer_by, &why)) {
    ::close(s.fd);
    throw job_error(name + ": the chief at " + me.chief +
                    " did not send the cluster: " + (sent ? why : "it closed the connection"));
  }
  const auto length = rendezvous_wire::reply_length(header);
  std::string payload(static_cast<std::size_t>(std::max<int64_t>(length, 0)), '\0');
  const bool complete = length >= 0 && socket_io::recv_exact(s.fd, payload, answer_by, &why);
  ::close(s.fd);
  if (!complete)
    throw job_error(name + ": the chief at " + me.chief + " sent a malformed answer" +
                    (length < 0 ? "" : ": " + why));
  try {
    return rendezvous_wire::tasks_of_reply(payload);
  } catch (const std::invalid_argument& e) {
    throw job_error(name + ": " + e.what());
  }
}

task_id join_cluster_from_environment(job_config& c, const environment_map& env) {
  if (!c.cluster) c.cluster.emplace();
  auto& spec = *c.cluster;
  const auto me = resolve_cluster_env(env, spec, machine_host_name());
  const auto secret = load_cluster_secret(spec);
  const seconds_d timeout(spec.join_timeout_seconds);
  spdlog::info("rank {} of {} (from {}): task {}, chief at {}", me.rank, me.world_size, me.source,
               me.task.str(), me.chief);
  cluster_tasks tasks;
  if (me.rank == 0) {
    tasks = me.world_size == 1 ? cluster_tasks{{"chief", {me.chief}}}
                               : serve_rendezvous(secret, me, spec.ps_ranks, timeout);
  } else {
    const uint16_t port = me.listen_port != 0 ? me.listen_port : free_port_at(me.advertise_host);
    tasks = join_rendezvous(secret, me, format_host_port(me.advertise_host, port), timeout);
  }
  spec.tasks = std::move(tasks);
  check_cluster(c);
  return me.task;
}

}  // namespace troupe
