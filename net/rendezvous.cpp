// The rendezvous at the chief (see rendezvous.hpp).
#include "net/rendezvous.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "config/secret.hpp"
#include "net/gate.hpp"
#include "net/socket.hpp"

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

// The gate's thread pushes and wakes the rendezvous' reactor; the
// rendezvous takes all after each turn of it.
class admitted_queue {
 public:
  explicit admitted_queue(net::reactor& loop) : loop_(loop) {}
  ~admitted_queue() {  // closes what arrived after the rendezvous was over
    for (auto& a : q_) ::close(a.fd);
  }
  admitted_queue(const admitted_queue&) = delete;
  admitted_queue& operator=(const admitted_queue&) = delete;

  void push(admitted a) {
    std::lock_guard<std::mutex> g(mu_);
    q_.push_back(std::move(a));
    loop_.wake();
  }
  std::deque<admitted> take_all() {
    std::lock_guard<std::mutex> g(mu_);
    return std::exchange(q_, {});
  }

 private:
  net::reactor& loop_;
  std::mutex mu_;
  std::deque<admitted> q_;
};

// A rank that announced itself and waits for the cluster.
struct announced {
  int fd;
  std::string address;
  std::string peer;
  std::string certificate;  // issued by the job CA for its task
};

void answer_and_close(int fd, const nlohmann::json& payload) {
  net::send_all(fd, rendezvous_wire::make_reply(payload),
                clock_type::now() + std::chrono::seconds(5));
  ::close(fd);
}

// The chief's reading of the announces: every admitted connection at once,
// each with its own deadline, so that a slow or silent one delays no other.
// An announce is checked once it is whole: the first to claim a rank holds
// it while its connection stays open; a later claimant of that rank, of a
// taken address, or of a rank other than the one it proved at the gate is
// refused, told why and logged. A rank whose connection closes before the
// cluster forms is free again.
class announce_reader {
 public:
  announce_reader(const cluster_env& me, int64_t ps_ranks, const job_authority& ca,
                  net::reactor& loop)
      : world_size_(me.world_size), ps_ranks_(ps_ranks), chief_(me.chief), ca_(ca), loop_(loop) {
    ranks_[0] = {-1, me.chief, "this process", ""};
  }
  ~announce_reader() {
    for (auto& p : pending_) ::close(p.who.fd);
  }
  announce_reader(const announce_reader&) = delete;
  announce_reader& operator=(const announce_reader&) = delete;

  bool complete() const { return static_cast<int64_t>(ranks_.size()) == world_size_; }

  // Complete, and every held connection still open. A claimant's announce
  // and its close can arrive in one turn with the last rank's announce: the
  // close is seen only by polling its connection once more, and a cluster
  // formed without that look would hold a dead rank and shut its restart out.
  bool complete_and_live() {
    if (!complete()) return false;
    loop_.clear();
    const auto held = watch_held();
    poll_all(0);
    drop_left(0, held);
    return complete();
  }
  std::map<int64_t, announced>& ranks() { return ranks_; }

  void add(admitted a) {
    pending_.push_back({std::move(a), std::string(rendezvous_wire::kAnnounceBytes, '\0'), 0,
                        clock_type::now() + kAnnounceTimeout});
  }

  // Waits until bytes arrive, the reactor is woken (a new admission) or
  // `until`, then reads and settles what it can.
  void turn(clock_type::time_point until) {
    loop_.clear();
    for (const auto& p : pending_) {
      loop_.watch(p.who.fd, POLLIN);
      until = std::min(until, p.deadline);
    }
    const auto held = watch_held();
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(until - clock_type::now());
    poll_all(static_cast<int>(std::max<int64_t>(wait.count(), 0)));
    const std::size_t first_held = pending_.size();
    read_pending();
    drop_left(first_held, held);
    drop_overdue();
  }

 private:
  // Watches the held connections; returns their ranks, in order.
  std::vector<int64_t> watch_held() {
    std::vector<int64_t> held;
    for (const auto& [r, a] : ranks_)
      if (a.fd >= 0) {
        loop_.watch(a.fd, POLLIN);
        held.push_back(r);
      }
    return held;
  }

  void poll_all(int timeout_ms) {
    if (loop_.wait(timeout_ms) < 0 && errno != EINTR)
      throw rendezvous_error(std::string("chief:0: rendezvous: poll failed: ") +
                             std::strerror(errno));
  }

  struct pending {
    admitted who;
    std::string frame;
    std::size_t got;
    clock_type::time_point deadline;
  };

  void read_pending() {
    std::vector<pending> still;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      auto& p = pending_[i];
      if (loop_.revents(i) == 0 || read_some(p)) still.push_back(std::move(p));
    }
    pending_ = std::move(still);
  }

  // Reads what `p` sent; false once it is settled (whole, or closed).
  bool read_some(pending& p) {
    const ssize_t n = ::recv(p.who.fd, p.frame.data() + p.got, p.frame.size() - p.got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) {
      spdlog::warn("chief:0: rendezvous: {} ({}) sent no announce: {}", p.who.name, p.who.peer,
                   n == 0 ? "it closed the connection" : std::strerror(errno));
      ::close(p.who.fd);
      return false;
    }
    p.got += static_cast<std::size_t>(n);
    if (p.got < p.frame.size()) return true;
    settle(p.who, p.frame);
    return false;
  }

  // A rank sends nothing after its announce: a held connection that became
  // readable has closed (or broken the protocol), and its rank is free.
  void drop_left(std::size_t first, const std::vector<int64_t>& held) {
    for (std::size_t k = 0; k < held.size(); ++k) {
      if (loop_.revents(first + k) == 0) continue;
      spdlog::warn(
          "chief:0: rendezvous: rank {} ({}) left before the cluster formed; its rank is "
          "free again",
          held[k], ranks_[held[k]].peer);
      ::close(ranks_[held[k]].fd);
      ranks_.erase(held[k]);
    }
  }

  void drop_overdue() {
    const auto now = clock_type::now();
    std::erase_if(pending_, [&](const pending& p) {
      if (p.deadline > now) return false;
      spdlog::warn("chief:0: rendezvous: {} ({}) sent no announce within {:g} s", p.who.name,
                   p.who.peer, std::chrono::duration<double>(kAnnounceTimeout).count());
      ::close(p.who.fd);
      return true;
    });
  }

  // Why a whole announce is refused, or "".
  std::string refusal(const admitted& a, const rendezvous_wire::announce_check& check) const {
    if (!check.problem.empty()) return check.problem;
    if (a.name != rank_name(check.rank))
      return "it proved the name " + a.name + " at the gate but announces rank " +
             std::to_string(check.rank);
    if (auto taken = ranks_.find(check.rank); taken != ranks_.end())
      return "rank " + std::to_string(check.rank) + " already joined from " + taken->second.peer +
             "; the certificate for " + role_of_rank(check.rank, ps_ranks_).str() +
             " is not issued again while that connection is open";
    for (const auto& [r, other] : ranks_)
      if (other.address == check.address)
        return "its address " + check.address + " is already rank " + std::to_string(r) + "'s" +
               (r == 0 ? " (the chief's, " + chief_ + ")" : "");
    return "";
  }

  void settle(const admitted& a, const std::string& frame) {
    const auto check = rendezvous_wire::check_announce(frame, world_size_);
    auto why = refusal(a, check);
    std::string certificate;
    const auto task = why.empty() ? role_of_rank(check.rank, ps_ranks_).str() : "";
    try {
      if (why.empty())
        certificate = ca_.issue(task, check.public_key, check.request, check.signature);
    } catch (const job_ca_error& e) {
      why = e.what();
    }
    if (!why.empty()) {
      spdlog::warn("chief:0: rendezvous: refused {} ({}): {}", a.name, a.peer, why);
      answer_and_close(a.fd, {{"error", why}});
      return;
    }
    spdlog::info(
        "chief:0: rendezvous: rank {} of {} joined, listening at {}; issued {} its certificate",
        check.rank, world_size_, check.address, task);
    ranks_[check.rank] = {a.fd, check.address, a.peer, std::move(certificate)};
  }

  int64_t world_size_;
  int64_t ps_ranks_;
  std::string chief_;
  const job_authority& ca_;
  net::reactor& loop_;  // the admissions' wake pipe and every connection's poll
  std::vector<pending> pending_;
  std::map<int64_t, announced> ranks_;
};

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

// The port this rank announces, listening already and held for its node's
// gate (net/gate.hpp, held_listeners): TROUPE_PORT's, else one the OS
// picks. Never given back to the OS in between, so no one else can take it.
uint16_t hold_listen_port(const cluster_env& me) {
  try {
    return held_listeners::hold(me.advertise_host, me.listen_port);
  } catch (const gate_error& e) {
    throw rendezvous_error(rank_name(me.rank) + ": " + e.what() +
                           " (TROUPE_ADVERTISE_ADDR or the host name, TROUPE_PORT)");
  }
}

std::string machine_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

}  // namespace

cluster_tasks serve_rendezvous(const std::string& secret, const cluster_env& me, int64_t ps_ranks,
                               seconds_d timeout, task_identity* issued) {
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(timeout);
  const auto hp = parse_host_port(me.chief);
  net::reactor loop;
  if (!loop.problem().empty()) throw rendezvous_error("chief:0: rendezvous: " + loop.problem());
  admitted_queue arrivals(loop);
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
  // The job CA: made now, in memory; its key is gone when this returns.
  const job_authority ca;
  announce_reader reader(me, ps_ranks, ca, loop);
  while (!reader.complete_and_live() && clock_type::now() < deadline) {
    for (auto& a : arrivals.take_all()) reader.add(std::move(a));
    reader.turn(deadline);
  }
  auto& ranks = reader.ranks();
  if (!reader.complete()) {
    door.reset();
    const auto missing = me.world_size - static_cast<int64_t>(ranks.size());
    const std::string why = (missing == 1 ? "rank " : "ranks ") +
                            missing_ranks(ranks, me.world_size) + " did not join the chief at " +
                            me.chief + " within " + fmt::format("{:g}", timeout.count()) +
                            " s (cluster.join_timeout_seconds)";
    for (auto& [r, a] : ranks)
      if (a.fd >= 0) answer_and_close(a.fd, {{"error", why}});
    throw rendezvous_error("chief:0: " + why);
  }
  // No one else joins; the port stays this process's, listening, until
  // troupe node's gate takes it (the address the tasks map gives out).
  held_listeners::keep(hp.host, hp.port, door->release_listener());
  door.reset();
  std::vector<std::string> addresses;
  for (const auto& [r, a] : ranks) addresses.push_back(a.address);
  auto tasks = tasks_of_ranks(addresses, ps_ranks);
  for (auto& [r, a] : ranks)
    if (a.fd >= 0)
      answer_and_close(a.fd,
                       {{"tasks", tasks}, {"certificate", a.certificate}, {"ca", ca.ca_pem()}});
  if (issued) *issued = ca.issue_self(me.task.str());
  return tasks;
}

namespace {

// The chief's rendezvous, past its gate as `name`: retried with backoff while
// nobody listens there yet, until `deadline`; throws rendezvous_error.
gate_socket reach_rendezvous(const std::string& secret, const cluster_env& me,
                             const std::string& name, clock_type::time_point deadline,
                             seconds_d timeout) {
  const auto chief = parse_host_port(me.chief);
  gate_options opts;
  opts.secret = secret;
  opts.name = name;
  auto backoff = std::chrono::milliseconds(100);
  std::string refusal;
  for (;;) {
    const auto left = std::chrono::duration_cast<caf::timespan>(deadline - clock_type::now());
    auto s = gate_secure_handshake(
        chief.host, chief.port, opts,
        std::clamp<caf::timespan>(left, std::chrono::milliseconds(100), std::chrono::seconds(10)));
    if (s.fd >= 0 && s.peer != kRendezvousGate) {
      ::close(s.fd);
      throw rendezvous_error(
          name + ": " + me.chief + " is " + s.peer +
          ", not the chief's rendezvous: its job has formed its cluster already");
    }
    if (s.fd >= 0) return s;
    if (!s.unreachable)
      throw rendezvous_error(name + ": joining the chief at " + me.chief + " failed: " + s.error);
    // A refusal that is not authenticated (a wrong secret on either side, or
    // someone else on the port) is retried; it is the likelier cause if the
    // deadline passes, so it is named then.
    if (gate_wire::names_refusal(s.error)) refusal = s.error;
    if (clock_type::now() + backoff >= deadline)
      throw rendezvous_error(
          name + ": cannot join the chief at " + me.chief + " within " +
          fmt::format("{:g}", timeout.count()) + " s (cluster.join_timeout_seconds): " + s.error +
          (refusal.empty() || refusal == s.error ? "" : "; before that: " + refusal));
    spdlog::debug("{}: the chief at {} is not there yet ({}); again in {} ms", name, me.chief,
                  s.error, backoff.count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(2 * backoff, std::chrono::seconds(2));
  }
}

// Sends `announce` on `fd` and reads the chief's reply payload by
// `answer_by`; closes `fd`; throws rendezvous_error.
std::string announce_and_read(int fd, const std::string& announce, const std::string& name,
                              const cluster_env& me, clock_type::time_point answer_by) {
  auto r = request_reply(fd, announce, answer_by);
  ::close(fd);
  using status = chief_reply::status;
  if (r.state == status::not_sent || r.state == status::no_answer)
    throw rendezvous_error(name + ": the chief at " + me.chief + " did not send the cluster: " +
                           (r.state == status::no_answer ? r.why : "it closed the connection"));
  if (r.state == status::malformed)
    throw rendezvous_error(name + ": the chief at " + me.chief + " sent a malformed answer" +
                           (r.why.empty() ? "" : ": " + r.why));
  return std::move(r.payload);
}

// The identity the chief's reply issued this rank, checked; throws rendezvous_error.
task_identity identity_of_reply(const std::string& payload, const task_key& key,
                                const std::string& name, const cluster_env& me) {
  const auto issued = rendezvous_wire::certificate_of_reply(payload);
  task_identity id{me.task.str(), issued.ca, issued.certificate, key.private_pem()};
  const auto problem = issued.certificate.empty() ? "it sent none" : check_task_identity(id);
  if (!problem.empty())
    throw rendezvous_error(name + ": the chief at " + me.chief +
                           " issued no usable certificate for " + id.task + ": " + problem);
  return id;
}

}  // namespace

chief_reply request_reply(int fd, const std::string& request, clock_type::time_point by) {
  chief_reply r;
  using status = chief_reply::status;
  std::string header(rendezvous_wire::kReplyHeaderBytes, '\0');
  if (!net::send_all(fd, request, by)) {
    r.state = status::not_sent;
    return r;
  }
  if (!net::recv_exact(fd, header, by, &r.why)) {
    r.state = status::no_answer;
    return r;
  }
  const auto length = rendezvous_wire::reply_length(header);
  r.payload.assign(static_cast<std::size_t>(std::max<int64_t>(length, 0)), '\0');
  if (length < 0 || !net::recv_exact(fd, r.payload, by, &r.why)) {
    r.state = status::malformed;
    r.payload.clear();
  }
  return r;
}

cluster_tasks join_rendezvous(const std::string& secret, const cluster_env& me,
                              const std::string& address, seconds_d timeout,
                              task_identity* issued) {
  const auto limit = std::chrono::duration_cast<clock_type::duration>(timeout);
  const std::string name = rank_name(me.rank);
  auto s = reach_rendezvous(secret, me, name, clock_type::now() + limit, timeout);
  spdlog::info("{}: joined the chief at {}; announced {}, waiting for the other ranks", name,
               me.chief, address);
  // The certificate request: a key made here, whose private half stays here.
  const task_key key;
  const auto request =
      rendezvous_wire::make_request(me.rank, me.world_size, address, key.public_raw());
  const auto announce = rendezvous_wire::make_announce(me.rank, me.world_size, address,
                                                       key.public_raw(), key.sign_request(request));
  // Once announced, the chief answers when every rank is there, or with an
  // error when it gives up (its own join timeout).
  const auto payload = announce_and_read(s.fd, announce, name, me,
                                         clock_type::now() + limit + std::chrono::seconds(5));
  cluster_tasks tasks;
  try {
    tasks = rendezvous_wire::tasks_of_reply(payload);
  } catch (const std::invalid_argument& e) {
    throw rendezvous_error(name + ": " + e.what());
  }
  if (issued) *issued = identity_of_reply(payload, key, name, me);
  return tasks;
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
  task_identity issued;
  if (me.rank == 0) {
    tasks = me.world_size == 1 ? cluster_tasks{{"chief", {me.chief}}}
                               : serve_rendezvous(secret, me, spec.ps_ranks, timeout, &issued);
  } else {
    const uint16_t port = hold_listen_port(me);
    tasks =
        join_rendezvous(secret, me, format_host_port(me.advertise_host, port), timeout, &issued);
  }
  spec.tasks = std::move(tasks);
  check_cluster(c);
  // The links use it unless cluster.identity or cluster.tls says otherwise
  // (net/secure_link.hpp, link_security_for).
  if (!issued.cert_pem.empty()) issued_identity::keep(std::move(issued));
  return me.task;
}

}  // namespace troupe
