#include "actors/reducer.hpp"
#include "actors/failure.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>

#include "actors/reducers/reduce_to_one.hpp"
#include "actors/reducers/ring_allreduce.hpp"
#include "actors/reducers/tree_allreduce.hpp"
#include "actors/visible_mailbox.hpp"
#include "config/job_config.hpp"
#include "trace/trace.hpp"

namespace troupe {

using namespace reducers;

const std::vector<std::string>& reducer_algorithms() {
  static const std::vector<std::string> names{"ring", "tree", "reduce_to_one"};
  return names;
}

namespace {

// Mechanism messages (bucket -1); algorithms use kinds >= 0.
constexpr int32_t kind_release = -1;  // "I have finished reading your buffers"
constexpr int32_t kind_hello = -2;    // broadcast: "my buffers are posted" (to the root)

// Buckets a rank keeps in flight: as many as keep the working set (every
// rank's region of every bucket in flight, which a ring reads and writes
// 2(n-1) times) within this budget, at least one, at most four. 16 MiB is half
// the 32 MiB L3 of the development machine; with the default 4 MiB buckets
// and 4 ranks that is one bucket at a time, which measured ~20% faster at 16
// and 64 MB than two (32 MiB in flight); see bench/README.md. (sysconf's L3
// size is not trusted: it reads 320 MiB on that VM.)
constexpr int64_t working_set_budget = int64_t{16} << 20;

// Bucket boundaries of a collective over `numel` floats (one bucket when
// alone: nothing moves).
std::vector<int64_t> bucket_bounds(int64_t numel, const reducer_config& cfg, int n) {
  int64_t bucket_elems = std::max<int64_t>(1, cfg.bucket_bytes / 4);
  int64_t nb = n == 1 ? 1 : std::max<int64_t>(1, (numel + bucket_elems - 1) / bucket_elems);
  return split_range(0, numel, nb);
}

std::size_t bucket_window(int64_t bucket_bytes, int n) {
  int64_t w = working_set_budget / std::max<int64_t>(1, bucket_bytes * n);
  return static_cast<std::size_t>(std::clamp<int64_t>(w, 1, 4));
}

// The two halves of an all-reduce run as the ring's, whatever the algorithm.
const ring_allreduce ring_halves;

const algorithm& algorithm_for(const std::unique_ptr<algorithm>& chosen, collective_kind kind) {
  if (kind == collective_kind::reduce_scatter || kind == collective_kind::all_gather)
    return ring_halves;
  return *chosen;
}

std::unique_ptr<algorithm> make_algorithm(const std::string& name, int n) {
  if (name == "ring") return std::make_unique<ring_allreduce>();
  if (name == "tree") return std::make_unique<tree_allreduce>();
  if (name == "reduce_to_one") return std::make_unique<reduce_to_one>(n);
  std::string known;
  for (const auto& k : reducer_algorithms()) known += (known.empty() ? "" : ", ") + k;
  throw std::invalid_argument("unknown reducer algorithm '" + name + "' (known: " + known + ")");
}

// What the reducers of one group share: each other's addresses and each
// rank's posted buffers.
struct group_shared {
  explicit group_shared(int size) : n(size), slots(static_cast<std::size_t>(size)) {}
  struct slot {
    std::mutex mtx;
    std::shared_ptr<const posted> p;
  };
  int n;
  std::mutex wiring_mtx;
  std::vector<caf::actor_addr> addrs;
  std::vector<slot> slots;
};

struct request {
  collective_kind kind = collective_kind::allreduce;
  reduce_op op = reduce_op::sum;
  int32_t root = 0;
  std::vector<tensor> tensors;
  caf::typed_response_promise<std::vector<tensor>> rp;
};

struct early_msg {
  bool abort = false;
  reduce_peer_msg m;
  std::string reason;
};

class collective;

struct reducer_state {
  int rank = 0;
  int n = 1;
  reducer_config cfg;
  std::shared_ptr<group_shared> group;
  std::unique_ptr<algorithm> algo;
  bool wired = false;
  std::vector<caf::actor_addr> peers;  // weak: the group's owner holds the handles
  std::vector<char> dead;
  std::string dead_reason;
  bool left = false;  // the owner took this rank out of the group (on_owner_abort)
  uint64_t next_seq = 0;
  std::deque<request> queue;
  std::unique_ptr<collective> cur;
  std::map<uint64_t, std::vector<early_msg>> early;  // messages for collectives not begun yet
  reducer_stats stats;
  // Timeline trace: the reducer's track, and one more per bucket in flight
  // beyond the first (buckets in flight overlap; spans on a track may not).
  trace::track_id track = trace::no_track;
  std::vector<trace::track_id> lanes;
  static inline const char* name = "reducer";
};

using self_ptr = reducer_actor::stateful_pointer<reducer_state>;

// One collective on one rank; the link its buckets' steps see.
class collective final : public link {
 public:
  collective(self_ptr s, uint64_t sq, request r) : self(s), seq(sq), req(std::move(r)) {}

  // The first time an algorithm touches peer p's buffers in this collective,
  // p's posted call is compared with ours; a difference throws peer_mismatch
  // (caught by the reducer, which fails the collective on every rank).
  const flat_view& peer(int p) override {
    auto& known = peers[static_cast<std::size_t>(p)];
    if (!known) fetch(p);
    return known->view;
  }
  void fetch(int p);

  void send(int to, int32_t bucket, int32_t kind, int64_t arg) override {
    send_peer(to, reduce_peer_msg{seq, rank, bucket, kind, arg});
  }

  void send_peer(int to, const reduce_peer_msg& m) {
    auto& st = self->state;
    ++st.stats.messages_sent;
    if (auto h = caf::actor_cast<reducer_actor>(st.peers[static_cast<std::size_t>(to)]))
      self->send(h, reduce_peer_atom::value, m);
  }

  self_ptr self;
  uint64_t seq;
  request req;
  std::shared_ptr<const posted> me;
  std::vector<std::shared_ptr<const posted>> peers;  // checked against ours on first use
  plan wiring;
  std::vector<std::unique_ptr<bucket_op>> buckets;
  std::vector<char> counted;  // bucket finished and counted
  std::size_t window = 1;     // buckets in flight at most
  std::size_t next_start = 0;
  std::size_t in_flight = 0;
  std::size_t finished = 0;
  int hellos = 0;
  bool gated = false;  // broadcast root: waits for every rank's hello
  int releases = 0;
  bool released = false;
  bool aborted = false;
  std::string reason;
  std::vector<char> abort_from;
  // Timeline trace: when the collective and each bucket began, the step it
  // serves, and which lane each bucket in flight occupies.
  double trace_begin = 0;
  int64_t trace_step = -1;
  std::vector<double> bucket_begin;
  std::vector<int> bucket_lane;
  std::vector<char> lane_busy;
};

const char* span_name(collective_kind k, bool bucket) {
  switch (k) {
    case collective_kind::allreduce:
      return bucket ? "all_reduce_bucket" : "all_reduce";
    case collective_kind::broadcast:
      return bucket ? "broadcast_bucket" : "broadcast";
    case collective_kind::reduce_scatter:
      return bucket ? "reduce_scatter_bucket" : "reduce_scatter";
    case collective_kind::all_gather:
      return bucket ? "all_gather_bucket" : "all_gather";
  }
  return "collective";
}

// Lane 0 is the reducer's own track (inside the collective's span); lanes
// beyond it are tracks of their own.
trace::track_id lane_track(self_ptr self, std::size_t lane) {
  auto& st = self->state;
  if (lane == 0) return st.track;
  while (st.lanes.size() < lane)
    st.lanes.push_back(trace::track("reducer:" + std::to_string(st.rank) +
                                    "/lane:" + std::to_string(st.lanes.size() + 1)));
  return st.lanes[lane - 1];
}

void trace_bucket_started(collective& c, std::size_t b) {
  if (!trace::enabled()) return;
  if (c.bucket_begin.size() < c.buckets.size()) {
    c.bucket_begin.assign(c.buckets.size(), 0);
    c.bucket_lane.assign(c.buckets.size(), -1);
  }
  std::size_t lane = 0;
  while (lane < c.lane_busy.size() && c.lane_busy[lane]) ++lane;
  if (lane == c.lane_busy.size()) c.lane_busy.push_back(0);
  c.lane_busy[lane] = 1;
  c.bucket_lane[b] = static_cast<int>(lane);
  c.bucket_begin[b] = trace::now_us();
}

void trace_bucket_done(self_ptr self, collective& c, std::size_t b) {
  if (!trace::enabled() || b >= c.bucket_lane.size() || c.bucket_lane[b] < 0) return;
  auto lane = static_cast<std::size_t>(c.bucket_lane[b]);
  c.lane_busy[lane] = 0;
  c.bucket_lane[b] = -1;
  trace::complete(lane_track(self, lane), span_name(c.kind, true), trace::category::communicate,
                  c.bucket_begin[b], trace::now_us(), {c.trace_step, static_cast<int64_t>(b), -1});
}

void collective::fetch(int p) {
  auto& slot = self->state.group->slots[static_cast<std::size_t>(p)];
  std::shared_ptr<const posted> theirs;
  {
    std::lock_guard<std::mutex> guard{slot.mtx};
    theirs = slot.p;
  }
  // The algorithms touch a peer's buffers only while it is in this
  // collective (it waits for our data, our release or our "down").
  if (!theirs || theirs->seq != seq)
    throw peer_mismatch("collective #" + std::to_string(seq) + ": rank " + std::to_string(p) +
                        " has not posted its buffers (reducer bug)");
  if (auto diff = compare_posted(rank, *me, p, *theirs); !diff.empty()) throw peer_mismatch(diff);
  peers[static_cast<std::size_t>(p)] = std::move(theirs);
}

void start_next(self_ptr self);
void maybe_finish(self_ptr self);

void wire(self_ptr self) {
  auto& st = self->state;
  if (st.wired) return;
  {
    std::lock_guard<std::mutex> guard{st.group->wiring_mtx};
    st.peers = st.group->addrs;
  }
  st.wired = true;
  for (int p = 0; p < st.n; ++p)
    if (p != st.rank) self->monitor(st.peers[static_cast<std::size_t>(p)]);
}

std::string who(self_ptr self) {
  return "reducer rank " + std::to_string(self->state.rank) + ": ";
}

// Fails the current collective on every rank: tell everyone (so they stop
// reading our buffers and fail too), then wait for everyone's abort before
// replying, so that nobody reads our buffers after the caller has them back.
void abort_current(self_ptr self, std::string reason) {
  auto& c = *self->state.cur;
  if (c.aborted) return;
  c.aborted = true;
  c.reason = std::move(reason);
  for (int p = 0; p < c.n; ++p)
    if (p != c.rank) {
      auto& st = self->state;
      ++st.stats.messages_sent;
      if (auto h = caf::actor_cast<reducer_actor>(st.peers[static_cast<std::size_t>(p)]))
        self->send(h, reduce_abort_atom::value, c.seq, static_cast<int32_t>(c.rank), c.reason);
    }
}

void start_buckets(self_ptr self) {
  auto& c = *self->state.cur;
  while (!c.aborted && !c.gated && c.in_flight < c.window && c.next_start < c.buckets.size()) {
    auto b = c.next_start++;
    trace_bucket_started(c, b);
    c.buckets[b]->start();
    if (c.counted[b]) continue;  // finished before its turn (it had nothing to send)
    if (c.buckets[b]->done()) {
      c.counted[b] = 1;
      ++c.finished;
      trace_bucket_done(self, c, b);
      continue;
    }
    ++c.in_flight;
  }
}

void on_bucket_message(self_ptr self, const reduce_peer_msg& m) {
  auto& c = *self->state.cur;
  auto b = static_cast<std::size_t>(m.bucket);
  if (m.bucket < 0 || b >= c.buckets.size()) {
    (void)c.peer(m.from);  // most likely its tensors differ from ours: say so
    abort_current(self, "collective #" + std::to_string(c.seq) + ": rank " +
                            std::to_string(m.from) + " sent a step for bucket " +
                            std::to_string(m.bucket) + " of " + std::to_string(c.buckets.size()));
    return;
  }
  c.buckets[b]->on_message(m.from, m.kind, m.arg);
  if (!c.counted[b] && c.buckets[b]->done()) {
    c.counted[b] = 1;
    ++c.finished;
    trace_bucket_done(self, c, b);
    if (b < c.next_start) --c.in_flight;
    start_buckets(self);
  }
}

// A peer message for the current collective.
void handle(self_ptr self, const reduce_peer_msg& m) {
  auto& c = *self->state.cur;
  if (c.aborted) return;  // after an abort nothing is read or written any more
  try {
    if (m.kind == kind_release) {
      ++c.releases;
    } else if (m.kind == kind_hello) {
      (void)c.peer(m.from);  // the broadcast root checks every rank before any data moves
      if (++c.hellos == c.n - 1 && c.gated) {
        c.gated = false;
        start_buckets(self);
      }
    } else {
      on_bucket_message(self, m);
    }
  } catch (const peer_mismatch& e) {
    abort_current(self, e.what());
  }
}

void dispatch(self_ptr self, const reduce_peer_msg& m) {
  auto& st = self->state;
  if (m.from < 0 || m.from >= st.n) return;
  if (m.seq >= st.next_seq) {  // a collective this rank has not begun yet
    st.early[m.seq].push_back(early_msg{false, m, {}});
    return;
  }
  if (!st.cur || m.seq != st.cur->seq) return;  // one this rank has finished
  handle(self, m);
  maybe_finish(self);
}

void on_abort(self_ptr self, uint64_t seq, int from, const std::string& reason) {
  auto& st = self->state;
  if (from < 0 || from >= st.n) return;
  if (seq >= st.next_seq) {
    st.early[seq].push_back(early_msg{true, {seq, from, -1, 0, 0}, reason});
    return;
  }
  if (!st.cur || seq != st.cur->seq) return;
  auto& c = *st.cur;
  c.abort_from[static_cast<std::size_t>(from)] = 1;
  abort_current(self, reason);
  maybe_finish(self);
}

void finish(self_ptr self, caf::error err) {
  auto& st = self->state;
  auto c = std::move(st.cur);
  ++st.stats.collectives;
  if (trace::enabled())
    trace::complete(st.track, span_name(c->kind, false), trace::category::communicate,
                    c->trace_begin, trace::now_us(),
                    {c->trace_step, -1,
                     c->me ? c->me->view.numel() * static_cast<int64_t>(sizeof(float)) : -1});
  if (err) {
    ++st.stats.failed;
    c->req.rp.deliver(std::move(err));
  } else {
    st.stats.bytes_reduced += c->me->view.numel() * static_cast<int64_t>(sizeof(float));
    // Copying a tensor is an acquire-release on its buffer's reference
    // count: done here after every write to the buffers (ours, and our
    // peers', which we acquired with their messages), and by a caller that
    // copies or drops the tensors it gets back, it keeps the hand-over
    // visible to ThreadSanitizer across CAF's (uninstrumented) mailbox.
    for (const auto& t : c->req.tensors) [[maybe_unused]] tensor touch = t;
    c->req.rp.deliver(std::move(c->req.tensors));
  }
  start_next(self);
}

void maybe_finish(self_ptr self) {
  auto& st = self->state;
  if (!st.cur) return;
  auto& c = *st.cur;
  if (c.aborted) {
    for (int p = 0; p < c.n; ++p)
      if (p != c.rank && !c.abort_from[static_cast<std::size_t>(p)] &&
          !st.dead[static_cast<std::size_t>(p)])
        return;
    finish(self, caf::make_error(caf::sec::invalid_argument, who(self) + c.reason));
    return;
  }
  if (c.finished < c.buckets.size()) return;
  if (!c.released) {
    c.released = true;
    for (int p : c.wiring.release_to)
      c.send_peer(p, reduce_peer_msg{c.seq, c.rank, -1, kind_release, 0});
  }
  if (c.releases < c.wiring.readers) return;
  finish(self, caf::none);
}

std::string check_request(const request& r, int n, uint64_t seq) {
  auto head = [&] { return "collective #" + std::to_string(seq) + ": "; };
  if ((r.kind == collective_kind::allreduce || r.kind == collective_kind::reduce_scatter) &&
      static_cast<uint8_t>(r.op) > 3)
    return head() + "unknown reduce op " + std::to_string(static_cast<int>(r.op));
  if (r.kind == collective_kind::broadcast && (r.root < 0 || r.root >= n))
    return head() + "broadcast root " + std::to_string(r.root) + " is not a rank of a group of " +
           std::to_string(n);
  for (std::size_t i = 0; i < r.tensors.size(); ++i)
    if (r.tensors[i].type() != dtype::f32)
      return head() + "tensor " + std::to_string(i) + " is " + dtype_name(r.tensors[i].type()) +
             "; reducers take float32 only";
  return {};
}

// Begins the next queued collective.
void begin(self_ptr self) {
  auto& st = self->state;
  wire(self);
  auto seq = st.next_seq++;
  auto cp = std::make_unique<collective>(self, seq, std::move(st.queue.front()));
  st.queue.pop_front();
  auto& c = *cp;
  st.cur = std::move(cp);
  if (trace::enabled()) {
    c.trace_begin = trace::now_us();
    c.trace_step = trace::step_of(st.rank);
  }
  c.rank = st.rank;
  c.n = st.n;
  c.kind = c.req.kind;
  c.op = c.req.op;
  c.root = c.req.root;
  c.chunk_elems = std::max<int64_t>(1, st.cfg.chunk_bytes / 4);
  auto me = std::make_shared<posted>();
  me->seq = seq;
  me->kind = c.kind;
  me->op = c.op;
  me->root = c.root;
  me->view = flat_view(c.req.tensors);
  c.me = me;
  c.mine = &me->view;
  {
    auto& slot = st.group->slots[static_cast<std::size_t>(st.rank)];
    std::lock_guard<std::mutex> guard{slot.mtx};
    slot.p = me;
  }
  c.peers.resize(static_cast<std::size_t>(c.n));
  c.abort_from.assign(static_cast<std::size_t>(c.n), 0);

  std::vector<early_msg> waiting;
  if (auto i = st.early.find(seq); i != st.early.end()) {
    waiting = std::move(i->second);
    st.early.erase(i);
  }
  // Aborts that came before we began count whatever our own verdict is.
  std::string early_abort;
  for (auto& e : waiting)
    if (e.abort) {
      c.abort_from[static_cast<std::size_t>(e.m.from)] = 1;
      if (early_abort.empty()) early_abort = e.reason;
    }
  if (auto bad = check_request(c.req, c.n, seq); !bad.empty())
    abort_current(self, std::move(bad));
  else if (!st.dead_reason.empty())
    abort_current(self, st.dead_reason);
  else if (!early_abort.empty())
    abort_current(self, std::move(early_abort));
  if (!c.aborted) {
    auto bounds = bucket_bounds(me->view.numel(), st.cfg, c.n);
    int64_t nb = static_cast<int64_t>(bounds.size()) - 1;
    st.stats.buckets += nb;
    c.window = bucket_window(st.cfg.bucket_bytes, c.n);
    if (c.n > 1) {
      const auto& algo = algorithm_for(st.algo, c.kind);
      c.wiring = algo.wire(c.rank, c.n, c.kind, c.root);
      for (int64_t b = 0; b < nb; ++b)
        c.buckets.push_back(algo.make(c, static_cast<int32_t>(b), bounds[b], bounds[b + 1]));
      c.counted.assign(c.buckets.size(), 0);
      if (c.kind == collective_kind::broadcast) {
        if (c.rank == c.root)
          c.gated = true;
        else
          c.send_peer(c.root, reduce_peer_msg{seq, c.rank, -1, kind_hello, 0});
      }
      try {
        start_buckets(self);
      } catch (const peer_mismatch& e) {
        abort_current(self, e.what());
      }
    }
  }
  // Replay what peers sent before this rank began (handle() never finishes
  // the collective, so `c` stays valid until maybe_finish()).
  for (auto& e : waiting)
    if (!e.abort) handle(self, e.m);
  maybe_finish(self);
}

void start_next(self_ptr self) {
  auto& st = self->state;
  while (!st.cur && !st.queue.empty()) begin(self);
}

void enqueue(self_ptr self, request r) {
  self->state.queue.push_back(std::move(r));
  start_next(self);
}

void on_peer_down(self_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (int p = 0; p < st.n; ++p)
    if (p != st.rank && st.peers[static_cast<std::size_t>(p)] == dm.source) {
      st.dead[static_cast<std::size_t>(p)] = 1;
      if (st.dead_reason.empty())
        st.dead_reason =
            "reducer rank " + std::to_string(p) + " is down (" + describe(dm.reason) + ")";
    }
  if (st.cur) {
    abort_current(self, st.dead_reason);
    maybe_finish(self);
  }
}

// The owner's abort: this rank leaves the group. Its peers are told, so
// that every collective of the group fails from then on instead of waiting
// for this rank (the one under way too). Sent after this rank's last read
// of a peer's buffers: a peer may hand them back once it hears.
void on_owner_abort(self_ptr self, const std::string& reason) {
  auto& st = self->state;
  if (st.left) return;
  st.left = true;
  if (st.dead_reason.empty())
    st.dead_reason = "rank " + std::to_string(st.rank) + " left: " + reason;
  if (st.cur) abort_current(self, st.dead_reason);
  wire(self);
  for (int p = 0; p < st.n; ++p)
    if (p != st.rank)
      if (auto h = caf::actor_cast<reducer_actor>(st.peers[static_cast<std::size_t>(p)]))
        self->send(h, reduce_left_atom::value, static_cast<int32_t>(st.rank), st.dead_reason);
  maybe_finish(self);
}

// A peer left: it is as good as down for this group.
void on_peer_left(self_ptr self, int from, const std::string& reason) {
  auto& st = self->state;
  if (from < 0 || from >= st.n || from == st.rank) return;
  st.dead[static_cast<std::size_t>(from)] = 1;
  if (st.dead_reason.empty()) st.dead_reason = reason;
  if (st.cur) {
    abort_current(self, st.dead_reason);
    maybe_finish(self);
  }
}

reducer_actor::behavior_type reducer_fn(self_ptr self, int rank, int n, reducer_config cfg,
                                        std::shared_ptr<group_shared> group) {
  keep_exception_cause(self, "reducer rank " + std::to_string(rank));
  auto& st = self->state;
  st.rank = rank;
  st.n = n;
  st.algo = make_algorithm(cfg.algorithm, n);
  st.cfg = std::move(cfg);
  st.group = std::move(group);
  st.dead.assign(static_cast<std::size_t>(n), 0);
  st.track = trace::track("reducer:" + std::to_string(rank));
  self->set_down_handler([self](caf::down_msg& dm) { on_peer_down(self, dm); });
  return {
      [self](allreduce_atom, reduce_op op,
             std::vector<tensor>& ts) -> caf::result<std::vector<tensor>> {
        auto rp = self->make_response_promise<std::vector<tensor>>();
        enqueue(self, request{collective_kind::allreduce, op, 0, std::move(ts), rp});
        return rp;
      },
      [self](reduce_scatter_atom, reduce_op op,
             std::vector<tensor>& ts) -> caf::result<std::vector<tensor>> {
        auto rp = self->make_response_promise<std::vector<tensor>>();
        enqueue(self, request{collective_kind::reduce_scatter, op, 0, std::move(ts), rp});
        return rp;
      },
      [self](all_gather_atom, std::vector<tensor>& ts) -> caf::result<std::vector<tensor>> {
        auto rp = self->make_response_promise<std::vector<tensor>>();
        enqueue(self, request{collective_kind::all_gather, reduce_op::sum, 0, std::move(ts), rp});
        return rp;
      },
      [self](broadcast_atom, int32_t root,
             std::vector<tensor>& ts) -> caf::result<std::vector<tensor>> {
        auto rp = self->make_response_promise<std::vector<tensor>>();
        enqueue(self, request{collective_kind::broadcast, reduce_op::sum, root, std::move(ts), rp});
        return rp;
      },
      [self](stats_atom) -> reducer_stats { return self->state.stats; },
      [self](reduce_peer_atom, const reduce_peer_msg& m) { dispatch(self, m); },
      [self](reduce_abort_atom, uint64_t seq, int32_t from, const std::string& reason) {
        on_abort(self, seq, from, reason);
      },
      [self](reduce_abort_atom, const std::string& reason) { on_owner_abort(self, reason); },
      [self](reduce_left_atom, int32_t from, const std::string& reason) {
        on_peer_left(self, from, reason);
      },
  };
}

// The reducer actor: reducer_fn's behavior, with its mailbox hand-over made
// visible to ThreadSanitizer (see actors/visible_mailbox.hpp).
class reducer_impl final : public visible_mailbox<reducer_actor::stateful_base<reducer_state>> {
 public:
  reducer_impl(caf::actor_config& cfg, int rank, int n, reducer_config rc,
               std::shared_ptr<group_shared> group)
      : visible_mailbox(cfg), rank_(rank), n_(n), rc_(std::move(rc)), group_(std::move(group)) {}

  behavior_type make_behavior() override {
    return reducer_fn(this, rank_, n_, std::move(rc_), std::move(group_));
  }

 private:
  int rank_;
  int n_;
  reducer_config rc_;
  std::shared_ptr<group_shared> group_;
};

}  // namespace

std::vector<std::pair<int64_t, int64_t>> reduce_scatter_segments(int64_t numel,
                                                                 const reducer_config& cfg, int n,
                                                                 int rank) {
  if (n < 1 || rank < 0 || rank >= n)
    throw std::invalid_argument("reduce_scatter_segments: rank " + std::to_string(rank) +
                                " of a group of " + std::to_string(n));
  if (n == 1) return {{0, numel}};
  auto bounds = bucket_bounds(numel, cfg, n);
  std::vector<std::pair<int64_t, int64_t>> out;
  int own = (rank + 1) % n;
  for (std::size_t b = 0; b + 1 < bounds.size(); ++b) {
    auto seg = split_range(bounds[b], bounds[b + 1], n);
    if (seg[own] < seg[own + 1]) out.emplace_back(seg[own], seg[own + 1]);
  }
  return out;
}

std::vector<reducer_actor> spawn_reducer_group(caf::actor_system& sys, int n,
                                               const reducer_config& cfg) {
  if (n < 1)
    throw std::invalid_argument("spawn_reducer_group: the group needs at least 1 rank, got " +
                                std::to_string(n));
  (void)make_algorithm(cfg.algorithm, n);  // throws for unknown names
  if (cfg.bucket_bytes <= 0 || cfg.chunk_bytes <= 0)
    throw std::invalid_argument("spawn_reducer_group: bucket_bytes and chunk_bytes must be > 0");
  auto group = std::make_shared<group_shared>(n);
  std::vector<reducer_actor> handles;
  for (int r = 0; r < n; ++r) handles.push_back(sys.spawn<reducer_impl>(r, n, cfg, group));
  std::lock_guard<std::mutex> guard{group->wiring_mtx};
  for (auto& h : handles) group->addrs.push_back(h.address());
  return handles;
}

reducer_config reducer_config_of(const job_config& c) {
  reducer_config r;
  r.algorithm = name_of(c.strategy.reducer.algorithm);
  r.bucket_bytes = c.strategy.reducer.bucket_bytes;
  r.chunk_bytes = c.strategy.reducer.chunk_bytes;
  return r;
}

}  // namespace troupe
