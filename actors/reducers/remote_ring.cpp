#include "actors/reducers/remote_ring.hpp"
#include "actors/failure.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "actors/reducers/collective.hpp"

namespace troupe {

namespace {

using reducers::flat_view;

caf::error ring_error(std::string text) {
  return caf::make_error(caf::sec::runtime_error, std::move(text));
}

// Applies the floats `in` of step `step` (of a ring of `n`) to the elements
// [pos, pos + len) of `view`: combined during the reduce-scatter (and
// finalized at its last step), copied during the all-gather.
void apply_floats(const flat_view& view, int64_t pos, const float* in, int64_t len, int32_t step,
                  int32_t n, reduce_op op) {
  float scale = op == reduce_op::mean ? 1.0f / static_cast<float>(n) : 1.0f;
  bool rs = step < n - 1;
  bool rs_last = step == n - 2;
  view.for_pieces(pos, pos + len, [&](std::size_t i, int64_t off, int64_t l) {
    float* mine = view.data[i] + off;
    if (rs_last)
      reducers::combine_final(mine, in, l, op, scale);
    else if (rs)
      reducers::combine(mine, in, l, op);
    else
      reducers::copy_floats(mine, in, l);
    in += l;
  });
}

// What the deserializer (on the middleman's thread) needs to apply a chunk
// of the running collective straight from CAF's receive buffer: the
// caller's buffers, open from the collective's start until just before its
// reply (or failure). The mutex makes closing wait for a chunk being applied.
//
// Why this is safe while the node works on the same buffers: each chunk
// covers the same element range at every step (the ranges travel with the
// chunks), and a range is written by step s + 1 (or the all-gather) only
// after the neighbours consumed what this rank sent of it before: the data
// that arrives was computed from it (so it was serialized before). That
// holds whichever thread deserializes (the multiplexer, or BASP workers).
// Reading the receive buffer's bytes as floats: only when float-aligned
// (with BASP's framing they are), else through a small aligned block.
class node_landing final : public ring_landing {
 public:
  void open(uint64_t seq, reduce_op op, int32_t n, const flat_view& v) {
    std::lock_guard<std::mutex> guard{mx_};
    open_ = true;
    seq_ = seq;
    op_ = op;
    n_ = n;
    view_.data = v.data;
    view_.offsets = v.offsets;
  }

  void close() {
    std::lock_guard<std::mutex> guard{mx_};
    open_ = false;
    view_ = flat_view{};
  }

  bool land(const ring_chunk& x, int64_t len, caf::deserializer& f, caf::error&) override {
    // Only from an in-memory buffer holding all the floats: then nothing can
    // fail halfway through (BASP deserializes from its receive buffer).
    auto* src = dynamic_cast<caf::binary_deserializer*>(&f);
    auto bytes = static_cast<std::size_t>(len) * sizeof(float);
    if (src == nullptr || src->remaining() < bytes) return false;
    std::lock_guard<std::mutex> guard{mx_};
    if (!open_ || x.seq != seq_ || x.op != op_ || x.total != view_.numel() || x.step < 0 ||
        x.step > 2 * (n_ - 1) - 1 || x.offset < 0 || len > x.total - x.offset)
      return false;  // the node sorts it out (early chunk, or an error to report)
    auto in = reinterpret_cast<const char*>(src->remainder().data());
    if (x.step >= n_ - 1) {
      // All-gather: a byte copy straight into the buffer.
      view_.for_pieces(x.offset, x.offset + len, [&](std::size_t i, int64_t off, int64_t l) {
        auto lb = static_cast<std::size_t>(l) * sizeof(float);
        std::memcpy(view_.data[i] + off, in, lb);
        in += lb;
      });
    } else if (reinterpret_cast<std::uintptr_t>(in) % alignof(float) == 0) {
      // Reduce-scatter, floats aligned in the receive buffer: combined from it.
      apply_floats(view_, x.offset, reinterpret_cast<const float*>(in), len, x.step, n_, op_);
    } else {
      // Misaligned: through a small L1-resident block.
      constexpr int64_t block = 4096;
      alignas(64) float tmp[block];
      for (int64_t done = 0; done < len;) {
        int64_t l = std::min(block, len - done);
        std::memcpy(tmp, in + done * static_cast<int64_t>(sizeof(float)),
                    static_cast<std::size_t>(l) * sizeof(float));
        apply_floats(view_, x.offset + done, tmp, l, x.step, n_, op_);
        done += l;
      }
    }
    src->skip(bytes);
    return true;
  }

 private:
  std::mutex mx_;
  bool open_ = false;
  uint64_t seq_ = 0;
  reduce_op op_ = reduce_op::sum;
  int32_t n_ = 0;
  flat_view view_;  // data pointers and offsets only
};

// A chunk still to be sent: which step and which elements (of the caller's
// buffer, which the chunk message then views).
struct out_item {
  int32_t step = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

struct pending_request {
  reduce_op op = reduce_op::sum;
  std::vector<tensor> tensors;
  caf::typed_response_promise<std::vector<tensor>> rp;
};

struct active_collective {
  uint64_t seq = 0;
  reduce_op op = reduce_op::sum;
  flat_view view;
  std::vector<int64_t> seg;  // P + 1 segment boundaries
  int64_t to_receive = 0;
  int64_t received = 0;
  int64_t to_send = 0;
  int64_t sent = 0;
  caf::typed_response_promise<std::vector<tensor>> rp;
};

struct ring_state {
  ring_options opt;
  int64_t chunk_elems = 1;
  int32_t rank = -1;
  int32_t n = 0;
  std::vector<ring_peer_actor> peers;
  std::string broken;                             // non-empty: the group failed for this reason
  std::map<int32_t, ring_peer_actor> introduced;  // joining: higher ranks' hellos
  // Direct links: offers (host, port, key) as they came, by claimed rank.
  struct link_offer {
    caf::strong_actor_ptr sender;
    std::string host;
    uint16_t port = 0;
    std::string key;
  };
  std::map<int32_t, link_offer> offers;
  uint64_t next_seq = 1;
  std::deque<pending_request> queue;
  std::optional<active_collective> act;
  // Chunks of collectives this rank has not started yet (not acknowledged:
  // bounded by the window).
  std::map<uint64_t, std::vector<ring_chunk>> early;
  std::deque<out_item> out;
  int32_t in_flight = 0;
  reducer_stats stats;
  std::shared_ptr<node_landing> landing = std::make_shared<node_landing>();

  static inline const char* name = "ring_node";

  int32_t mod(int64_t x) const { return static_cast<int32_t>(((x % n) + n) % n); }
  int32_t left() const { return mod(rank - 1); }
  int32_t right() const { return mod(rank + 1); }
  // The segment rank `r` sends at step `s`.
  int32_t send_seg(int32_t r, int32_t s) const {
    return s < n - 1 ? mod(r - s) : mod(r + 1 - (s - (n - 1)));
  }
  int32_t last_step() const { return 2 * (n - 1) - 1; }
  int64_t chunks_of(int32_t seg_index, const std::vector<int64_t>& seg) const {
    return reducers::chunk_count(seg[seg_index + 1] - seg[seg_index], chunk_elems);
  }
};

// A ring node runs as a plain actor or, where the middleman is loaded, as a
// broker on the middleman's thread (see spawn_ring_node): the same code for
// both self types.
template <class>
struct broker_with;
template <class... Sigs>
struct broker_with<caf::detail::type_list<Sigs...>> {
  using type = caf::io::typed_broker<Sigs...>;
};
using ring_broker_base = broker_with<ring_node_actor::signatures>::type;
using ring_actor_self = ring_node_actor::stateful_pointer<ring_state>;
using ring_broker_self = caf::stateful_actor<ring_state, ring_broker_base>*;

template <class Self>
void fail_all(Self self, const std::string& reason, bool tell_peers) {
  auto& st = self->state;
  if (!st.broken.empty()) return;
  st.broken = reason;
  st.landing->close();  // before the reply: the caller may reuse its buffers
  uint64_t seq = st.act ? st.act->seq : st.next_seq;
  if (st.act) {
    st.act->rp.deliver(ring_error(reason));
    ++st.stats.collectives;
    ++st.stats.failed;
    st.act.reset();
  }
  for (auto& r : st.queue) {
    r.rp.deliver(ring_error(reason));
    ++st.stats.collectives;
    ++st.stats.failed;
  }
  st.queue.clear();
  st.early.clear();
  st.out.clear();
  if (tell_peers)
    for (int32_t p = 0; p < st.n; ++p)
      if (p != st.rank) self->send(st.peers[p], ring_abort_atom::value, seq, st.rank, reason);
  // Drop the peers' handles: nodes holding each other's handles would keep
  // each other alive (and the actor_system's destructor waiting) forever.
  st.peers.clear();
}

std::string where(const ring_state& st) {
  return "remote_ring rank " + std::to_string(st.rank) + "/" + std::to_string(st.n);
}

template <class Self>
void start_next(Self self);

template <class Self>
void check_done(Self self) {
  auto& st = self->state;
  if (!st.act) return;
  auto& a = *st.act;
  // Sent chunks are views of the caller's buffers: the reply waits until the
  // right neighbour acknowledged the last of them.
  if (a.received < a.to_receive || a.sent < a.to_send || st.in_flight > 0) return;
  st.landing->close();
  ++st.stats.collectives;
  st.stats.bytes_reduced += a.view.numel() * static_cast<int64_t>(sizeof(float));
  a.rp.deliver(std::move(a.view.tensors));
  st.act.reset();
  start_next(self);
}

// Sends queued chunks while the window allows.
template <class Self>
void pump(Self self) {
  auto& st = self->state;
  while (st.act && !st.out.empty() && st.in_flight < st.opt.window) {
    auto it = st.out.front();
    st.out.pop_front();
    auto& a = *st.act;
    ring_chunk ch;
    ch.seq = a.seq;
    ch.step = it.step;
    ch.offset = it.begin;
    ch.total = a.view.numel();
    ch.op = a.op;
    ch.dest = st.peers[st.right()].id();
    // Views of the caller's buffers, no copy: they stay untouched until the
    // right neighbour acknowledges the chunk (see check_done).
    a.view.for_pieces(it.begin, it.end, [&](std::size_t i, int64_t off, int64_t len) {
      ch.pieces.push_back({a.view.data[i] + off, len});
      ch.keep.push_back(a.view.tensors[i]);
    });
    self->send(st.peers[st.right()], ring_chunk_atom::value, std::move(ch));
    ++st.in_flight;
    ++a.sent;
    ++st.stats.buckets;
    ++st.stats.messages_sent;
  }
}

// Consumes one chunk of the active collective (from the left neighbour).
template <class Self>
void consume(Self self, const ring_chunk& ch) {
  auto& st = self->state;
  auto& a = *st.act;
  int64_t len = ch.numel();
  if (ch.total != a.view.numel() || ch.op != a.op) {
    fail_all(self,
             where(st) + ": collective " + std::to_string(a.seq) + " mismatch: rank " +
                 std::to_string(st.left()) + " reduces " + std::to_string(ch.total) +
                 " elements with " + reduce_op_name(ch.op) + ", this rank " +
                 std::to_string(a.view.numel()) + " with " + reduce_op_name(a.op),
             true);
    return;
  }
  if (ch.pieces.size() != ch.keep.size() || ch.step < 0 || ch.step > st.last_step() ||
      ch.offset < 0 || ch.offset + len > a.view.numel() || (ch.landed > 0 && !ch.pieces.empty())) {
    fail_all(self, where(st) + ": malformed chunk from rank " + std::to_string(st.left()), true);
    return;
  }
  // Landed chunks are applied already (by the deserializer); the others
  // straight from their pieces (the received block, or in one process the
  // sender's buffer) into this rank's buffers.
  int64_t pos = ch.offset;
  for (auto& p : ch.pieces) {
    apply_floats(a.view, pos, p.data, p.len, ch.step, st.n, a.op);
    pos += p.len;
  }
  if (ch.step < st.last_step()) st.out.push_back({ch.step + 1, ch.offset, ch.offset + len});
  ++a.received;
  self->send(st.peers[st.left()], ring_credit_atom::value, int32_t{1});
  ++st.stats.messages_sent;
}

template <class Self>
void start_next(Self self) {
  auto& st = self->state;
  if (st.act || st.queue.empty() || !st.broken.empty()) return;
  auto req = std::move(st.queue.front());
  st.queue.pop_front();
  st.act.emplace();
  auto& a = *st.act;
  a.seq = st.next_seq++;
  a.op = req.op;
  a.view = flat_view(std::move(req.tensors));
  a.rp = std::move(req.rp);
  a.seg = reducers::split_range(0, a.view.numel(), st.n);
  st.landing->open(a.seq, a.op, st.n, a.view);
  for (int32_t s = 0; s <= st.last_step(); ++s) {
    a.to_send += st.chunks_of(st.send_seg(st.rank, s), a.seg);
    a.to_receive += st.chunks_of(st.send_seg(st.left(), s), a.seg);
  }
  // Step 0: this rank's own segment.
  int32_t k = st.rank;
  for (int64_t b = a.seg[k];; b += st.chunk_elems) {
    int64_t e = std::min(a.seg[k + 1], b + st.chunk_elems);
    st.out.push_back({0, b, e});
    if (e >= a.seg[k + 1]) break;
  }
  self->delayed_send(self, st.opt.timeout, ring_timeout_atom::value, a.seq);
  pump(self);
  auto it = st.early.find(a.seq);
  if (it != st.early.end()) {
    auto held = std::move(it->second);
    st.early.erase(it);
    for (auto& ch : held) {
      if (!st.act || st.act->seq != ch.seq) break;  // failed meanwhile
      consume(self, ch);
      pump(self);
    }
  }
  check_done(self);
}

// The node's handlers, one per message; ring_node_impl wires them.

// Chunks from other processes land straight in the running collective's
// buffers (see node_landing) until this node is gone.
template <class Self>
void init_node(Self self, const ring_options& opt) {
  auto& st = self->state;
  st.opt = opt;
  st.opt.window = std::max<int32_t>(1, opt.window);
  st.chunk_elems = std::max<int64_t>(1, opt.chunk_bytes / static_cast<int64_t>(sizeof(float)));
  auto& sys = self->home_system();
  auto id = self->id();
  set_ring_landing(sys, id, st.landing);
  self->attach_functor([&sys, id] { set_ring_landing(sys, id, nullptr); });
}

// Told to stop: drop the peers' handles first. Nodes of one process hold
// each other's handles; brokers (on_middleman_thread) do not release their
// state on exit, so the cycle would outlive the group.
template <class Self>
void on_stop_asked(Self self, caf::exit_msg& em) {
  self->state.peers.clear();
  self->state.introduced.clear();
  self->quit(std::move(em.reason));
}

template <class Self>
void on_peer_down(Self self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (int32_t p = 0; p < static_cast<int32_t>(st.peers.size()); ++p)
    if (p != st.rank && st.peers[p].address() == dm.source) {
      // A peer stopped on purpose (user_shutdown) is stopped with the whole
      // group: every node gets its own down message, and aborts sent to
      // nodes already gone would only pile up (brokers in one process
      // then keep each other alive).
      fail_all(
          self,
          where(st) + ": lost peer rank " + std::to_string(p) + " (" + describe(dm.reason) + ")",
          dm.reason != caf::exit_reason::user_shutdown);
      return;
    }
}

template <class Self>
void on_chunk(Self self, ring_chunk& ch) {
  auto& st = self->state;
  if (!st.broken.empty()) return;
  if (ch.landed > 0 && (!st.act || ch.seq != st.act->seq)) {
    // Cannot happen: a chunk lands only in the running collective,
    // which does not end before the node consumed all its chunks.
    fail_all(self,
             where(st) + ": chunk of collective " + std::to_string(ch.seq) + " landed outside it",
             true);
    return;
  }
  if (!st.act || ch.seq > st.act->seq) {
    st.early[ch.seq].push_back(std::move(ch));
    return;
  }
  if (ch.seq < st.act->seq) {  // stale: acknowledge and drop
    self->send(st.peers[st.left()], ring_credit_atom::value, int32_t{1});
    return;
  }
  consume(self, ch);
  pump(self);
  check_done(self);
}

template <class Self>
void on_credit(Self self, int32_t k) {
  auto& st = self->state;
  st.in_flight = std::max(0, st.in_flight - k);
  pump(self);
  check_done(self);
}

template <class Self>
void on_timeout(Self self, uint64_t seq) {
  auto& st = self->state;
  if (!st.act || st.act->seq != seq) return;
  auto& a = *st.act;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(st.opt.timeout).count();
  fail_all(self,
           where(st) + ": collective " + std::to_string(seq) + " timed out after " +
               std::to_string(ms) + " ms" + " (received " + std::to_string(a.received) + "/" +
               std::to_string(a.to_receive) + " chunks from rank " + std::to_string(st.left()) +
               ", sent " + std::to_string(a.sent) + "/" + std::to_string(a.to_send) + " to rank " +
               std::to_string(st.right()) + ")",
           true);
}

template <class Self>
caf::result<int32_t> on_wire(Self self, int32_t rank, std::vector<ring_peer_actor>& peers) {
  auto& st = self->state;
  if (st.n > 0) return ring_error(where(st) + ": already wired");
  auto n = static_cast<int32_t>(peers.size());
  if (rank < 0 || rank >= n)
    return ring_error("remote_ring: rank " + std::to_string(rank) + " out of range for " +
                      std::to_string(n) + " peers");
  for (int32_t p = 0; p < n; ++p)
    if (!peers[p]) return ring_error("remote_ring: peer " + std::to_string(p) + " is invalid");
  if (peers[rank].address() != self->address())
    return ring_error("remote_ring: peers[" + std::to_string(rank) + "] is not this node");
  st.rank = rank;
  st.n = n;
  st.peers = std::move(peers);
  for (int32_t p = 0; p < n; ++p)
    if (p != rank) self->monitor(st.peers[p]);
  start_next(self);
  return n;
}

template <class Self>
caf::result<ring_peer_actor> on_known(Self self, int32_t rank) {
  auto& known = self->state.introduced;
  auto i = known.find(rank);
  if (i == known.end())
    return ring_error("remote_ring: rank " + std::to_string(rank) + " has not joined yet");
  return i->second;
}

// This process's direct-link offer, forwarded to the left neighbour.
template <class Self>
void on_own_offer(Self self, std::string& host, uint16_t port, std::string& key) {
  auto& st = self->state;
  // From this process only: a remote sender could otherwise point the
  // left neighbour's gradients at an address of its choosing.
  auto sender = self->current_sender();
  if (sender && sender->node() != self->node()) {
    spdlog::warn("{}: a direct-link offer to forward from another process; dropped", where(st));
    return;
  }
  if (st.n < 2) return;  // not wired (or alone): nobody to offer to
  self->send(st.peers[st.left()], ring_offer_atom::value, st.rank, std::move(host), port,
             std::move(key));
}

// The offer rank `from` made, when asked for.
template <class Self>
caf::result<std::string, uint16_t, std::string> on_offer_asked(Self self, int32_t from) {
  auto& st = self->state;
  auto i = st.offers.find(from);
  if (st.n < 2 || i == st.offers.end())
    return ring_error("remote_ring: rank " + std::to_string(from) + " has made no offer yet");
  // Only the right neighbour's node offers, and only as itself.
  auto& o = i->second;
  auto peer = caf::actor_cast<caf::strong_actor_ptr>(st.peers[st.right()]);
  if (from != st.right() || !o.sender || o.sender->node() != peer->node() ||
      o.sender->id() != peer->id()) {
    st.offers.erase(i);
    spdlog::warn("{}: a direct-link offer claiming rank {} not from that rank's node; dropped",
                 where(st), from);
    return ring_error("remote_ring: rank " + std::to_string(from) + " has made no offer yet");
  }
  return {o.host, o.port, o.key};
}

template <class Self>
caf::result<std::vector<tensor>> on_allreduce(Self self, reduce_op op, std::vector<tensor>& ts) {
  auto& st = self->state;
  if (!st.broken.empty()) return ring_error(st.broken);
  if (st.n == 0) return ring_error("remote_ring: node is not wired");
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (ts[i].type() != dtype::f32)
      return ring_error("remote_ring: tensor " + std::to_string(i) + " is " +
                        dtype_name(ts[i].type()) + ", only float32 is reduced");
  if (st.n == 1) {  // op over one rank = identity (mean: x / 1)
    ++st.stats.collectives;
    return std::move(ts);
  }
  auto rp = self->template make_response_promise<std::vector<tensor>>();
  st.queue.push_back({op, std::move(ts), rp});
  start_next(self);
  return rp;
}

template <class Self>
ring_node_actor::behavior_type ring_node_impl(Self self, ring_options opt) {
  keep_exception_cause(self, "ring node");
  init_node(self, opt);
  self->set_exit_handler([=](caf::exit_msg& em) { on_stop_asked(self, em); });
  self->set_down_handler([=](caf::down_msg& dm) { on_peer_down(self, dm); });
  return {
      [=](ring_chunk_atom, ring_chunk& ch) { on_chunk(self, ch); },
      [=](ring_credit_atom, int32_t k) { on_credit(self, k); },
      // From a peer; or from this node's owner with this node's own rank
      // (actors/reducer_group.hpp: the rank leaves), which the peers are
      // then told, so that none stays waiting in the collective.
      [=](ring_abort_atom, uint64_t seq, int32_t from, std::string& reason) {
        fail_all(self,
                 where(self->state) + ": collective " + std::to_string(seq) + " aborted by rank " +
                     std::to_string(from) + ": " + reason,
                 from == self->state.rank);
      },
      [=](ring_timeout_atom, uint64_t seq) { on_timeout(self, seq); },
      [=](ring_wire_atom, int32_t rank, std::vector<ring_peer_actor>& peers) {
        return on_wire(self, rank, peers);
      },
      [=](ring_hello_atom, int32_t rank, ring_peer_actor& peer) {
        self->state.introduced[rank] = std::move(peer);
      },
      [=](ring_known_atom, int32_t rank) { return on_known(self, rank); },
      [=](ring_offer_atom, std::string& host, uint16_t port, std::string& key) {
        on_own_offer(self, host, port, key);
      },
      [=](ring_offer_atom, int32_t from, std::string& host, uint16_t port, std::string& key) {
        // Kept with its sender: this node may not be wired yet (the right
        // neighbour can finish its rendezvous first); checked when asked for.
        self->state.offers[from] = {self->current_sender(), std::move(host), port, std::move(key)};
      },
      [=](ring_offer_atom, int32_t from) { return on_offer_asked(self, from); },
      [=](allreduce_atom, reduce_op op, std::vector<tensor>& ts) {
        return on_allreduce(self, op, ts);
      },
      [=](stats_atom) { return self->state.stats; },
  };
}

}  // namespace

ring_node_actor spawn_ring_node(caf::actor_system& sys, ring_options opts) {
  if (opts.on_middleman_thread && sys.has_middleman())
    return sys.middleman().spawn_broker(ring_node_impl<ring_broker_self>, opts);
  return sys.spawn(ring_node_impl<ring_actor_self>, opts);
}

std::vector<ring_node_actor> spawn_ring_group(caf::actor_system& sys, int n, ring_options opts) {
  std::vector<ring_node_actor> nodes;
  std::vector<ring_peer_actor> peers;
  // All local: no chunk is deserialized, so a node gains nothing from the
  // middleman's thread, and the group's combines would share that one thread.
  opts.on_middleman_thread = false;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(spawn_ring_node(sys, opts));
    peers.emplace_back(nodes.back());
  }
  for (int i = 0; i < n; ++i)
    if (auto err = wire_ring_node(sys, nodes[i], i, peers))
      throw std::runtime_error("spawn_ring_group: " + describe(err));
  return nodes;
}

void stop_ring_nodes(const std::vector<ring_node_actor>& nodes) {
  for (auto& n : nodes) caf::anon_send_exit(n, caf::exit_reason::user_shutdown);
}

caf::expected<std::vector<tensor>> ring_allreduce(caf::actor_system& sys,
                                                  const ring_node_actor& node, reduce_op op,
                                                  std::vector<tensor> tensors,
                                                  caf::timespan timeout) {
  caf::scoped_actor self{sys};
  caf::expected<std::vector<tensor>> result{caf::sec::request_timeout};
  self->request(node, timeout, allreduce_atom::value, op, std::move(tensors))
      .receive([&](std::vector<tensor>& ts) { result = std::move(ts); },
               [&](caf::error& e) { result = std::move(e); });
  return result;
}

}  // namespace troupe
