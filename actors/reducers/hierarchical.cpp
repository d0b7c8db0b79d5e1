#include "actors/reducers/hierarchical.hpp"
#include "actors/failure.hpp"

#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "actors/visible_mailbox.hpp"

namespace troupe {

namespace {

// What local rank 0 broadcasts with the result (the status float).
constexpr float status_ok = 0;
constexpr float status_local_failed = 1;  // the local all-reduce failed in this process
constexpr float status_ring_failed = 2;   // rank 0's ring request failed
constexpr float status_elsewhere = 3;     // another process reported a failure through the ring

const std::string head = "hierarchical all-reduce: ";

caf::error hier_error(std::string text) {
  return caf::make_error(caf::sec::runtime_error, std::move(text));
}

bool valid_op(reduce_op op) {
  return static_cast<uint8_t>(op) <= static_cast<uint8_t>(reduce_op::max);
}

// The op of the local and ring stages: a mean is a sum until the very end,
// scaled once by the global replica count.
reduce_op stage_op(reduce_op op) {
  return op == reduce_op::mean ? reduce_op::sum : op;
}

// A failed process's contribution to the status float of the ring: whatever
// the op (sum, min or max of 0s and this), the ring's result is non-zero iff
// some process contributed it.
float ring_failure_value(reduce_op ring_op) {
  return ring_op == reduce_op::min ? -1.0f : 1.0f;
}

enum class stage : uint8_t { idle, local_reduce, ring, broadcast };

struct job {
  reduce_op op = reduce_op::sum;
  std::vector<tensor> tensors;
  caf::typed_response_promise<std::vector<tensor>> rp;
};

struct hier_state {
  hierarchical_config cfg;
  std::deque<job> queue;
  std::optional<job> cur;
  uint64_t seq = 0;  // number of `cur`: replies for earlier ones are stale
  stage at = stage::idle;
  bool local_failed = false;
  std::string failure;  // this rank's own first failure in `cur`
  float status = status_ok;
  std::string ring_down;  // the ring node died: the ring stage fails at once
  std::string broken;     // non-empty: every call fails with this
  reducer_stats stats;
  static inline const char* name = "hierarchical_reducer";
};

using self_ptr = reducer_actor::stateful_pointer<hier_state>;

// "... peer rank 1 ..." -> "... peer rank 1 (worker:1) ...": the ring only
// knows ranks, the user knows tasks.
std::string with_ring_names(const hier_state& st, std::string text) {
  for (std::size_t r = 0; r < st.cfg.ring_names.size(); ++r) {
    auto key = "rank " + std::to_string(r) + " ";
    auto at = text.find(key);
    if (at != std::string::npos)
      text.insert(at + key.size() - 1, " (" + st.cfg.ring_names[r] + ")");
  }
  return text;
}

std::string stage_failure(const hier_state& st, const char* what, const caf::error& e) {
  if (e == caf::sec::request_timeout)
    return head + what + ": no reply within " +
           std::to_string(
               std::chrono::duration_cast<std::chrono::milliseconds>(st.cfg.timeout).count()) +
           " ms";
  return head + what + ": " + with_ring_names(st, describe(e));
}

tensor status_tensor(float v) {
  return tensor::from<float>({1}, {v});
}

void start_next(self_ptr self);

void finish(self_ptr self, caf::error err) {
  auto& st = self->state;
  auto j = std::move(*st.cur);
  st.cur.reset();
  st.at = stage::idle;
  ++st.stats.collectives;
  if (err) {
    ++st.stats.failed;
    j.rp.deliver(std::move(err));
  } else {
    // Copying a tensor is an acquire-release on its buffer's reference count
    // (as in actors/reducer.cpp): it shows ThreadSanitizer the hand-over of
    // the buffers this actor scaled to a caller that copies or drops them.
    for (const auto& t : j.tensors) {
      [[maybe_unused]] tensor touch = t;
      st.stats.bytes_reduced += static_cast<int64_t>(t.nbytes());
    }
    j.rp.deliver(std::move(j.tensors));
  }
  start_next(self);
}

// Stops for good: a stage whose request timed out may still complete later,
// so this rank no longer knows where its groups stand.
void go_broken(self_ptr self, std::string reason) {
  auto& st = self->state;
  if (!st.broken.empty()) return;
  st.broken = "hierarchical reducer is broken: " + reason;
  if (st.cur) {
    auto j = std::move(*st.cur);
    st.cur.reset();
    st.at = stage::idle;
    ++st.stats.collectives;
    ++st.stats.failed;
    j.rp.deliver(hier_error(std::move(reason)));
  }
  for (auto& j : st.queue) {
    ++st.stats.collectives;
    ++st.stats.failed;
    j.rp.deliver(hier_error(st.broken));
  }
  st.queue.clear();
}

bool current(self_ptr self, uint64_t s, stage expected) {
  auto& st = self->state;
  return st.cur && st.seq == s && st.at == expected;
}

void on_broadcast(self_ptr self, std::vector<tensor>& out) {
  auto& st = self->state;
  float status = out.empty() ? status_ok : out.back().f32()[0];
  if (!st.failure.empty()) {
    finish(self, hier_error(st.failure));
    return;
  }
  if (status == status_ring_failed) {
    finish(self, hier_error(head + "ring stage failed on local rank 0 of this process"));
    return;
  }
  if (status == status_elsewhere) {
    finish(self, hier_error(head + "ring stage: another process failed this collective"));
    return;
  }
  if (status != status_ok) {
    finish(self, hier_error(head + "local all-reduce stage failed on local rank 0"));
    return;
  }
  if (st.cur->op == reduce_op::mean) {
    const float scale = 1.0f / static_cast<float>(st.cfg.global_replicas);
    for (auto& t : st.cur->tensors)
      for (float& x : t.span<float>()) x *= scale;
  }
  finish(self, caf::none);
}

void broadcast_stage(self_ptr self) {
  auto& st = self->state;
  st.at = stage::broadcast;
  auto s = st.seq;
  // After a local failure (which every local rank saw) only the status
  // travels: the ranks' tensors may be the mismatch itself.
  std::vector<tensor> ts;
  if (!st.local_failed) ts = st.cur->tensors;
  ts.push_back(status_tensor(st.cfg.local_rank == 0 ? st.status : status_ok));
  self->request(st.cfg.local, st.cfg.timeout, broadcast_atom::value, int32_t{0}, std::move(ts))
      .then(
          [self, s](std::vector<tensor>& out) {
            if (current(self, s, stage::broadcast)) on_broadcast(self, out);
          },
          [self, s](caf::error& e) {
            if (!current(self, s, stage::broadcast)) return;
            auto& st = self->state;
            auto why = stage_failure(st, "local broadcast stage", e);
            if (e == caf::sec::request_timeout) {
              go_broken(self, why);
              return;
            }
            finish(self, hier_error(st.failure.empty() ? why : st.failure));
          });
}

void on_ring_failed(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.failure.empty()) {
    st.failure = why;
    st.status = status_ring_failed;
  }
  broadcast_stage(self);
}

void ring_stage(self_ptr self) {
  auto& st = self->state;
  st.at = stage::ring;
  if (!st.ring_down.empty()) {
    on_ring_failed(self, head + "ring stage: " + st.ring_down);
    return;
  }
  auto s = st.seq;
  auto ring_op = valid_op(st.cur->op) ? stage_op(st.cur->op) : reduce_op::sum;
  // Even after a local failure this rank takes part, so that the other
  // processes' ring nodes are not left waiting, and tells them it failed.
  auto ts = st.cur->tensors;
  ts.push_back(status_tensor(st.local_failed ? ring_failure_value(ring_op) : 0.0f));
  self->request(st.cfg.ring, st.cfg.timeout, allreduce_atom::value, ring_op, std::move(ts))
      .then(
          [self, s](std::vector<tensor>& out) {
            if (!current(self, s, stage::ring)) return;
            auto& st = self->state;
            if (st.local_failed)
              st.status = status_local_failed;
            else if (out.empty() || out.back().f32()[0] != 0.0f)
              st.status = status_elsewhere;
            broadcast_stage(self);
          },
          [self, s](caf::error& e) {
            if (!current(self, s, stage::ring)) return;
            on_ring_failed(self, stage_failure(self->state, "ring stage", e));
          });
}

void after_local(self_ptr self) {
  auto& st = self->state;
  if (st.cfg.local_rank == 0) {
    st.status = st.local_failed ? status_local_failed : status_ok;
    if (st.cfg.ring) {
      ring_stage(self);
      return;
    }
  }
  broadcast_stage(self);
}

void start_next(self_ptr self) {
  auto& st = self->state;
  if (st.cur || st.queue.empty() || !st.broken.empty()) return;
  st.cur = std::move(st.queue.front());
  st.queue.pop_front();
  auto s = ++st.seq;
  st.at = stage::local_reduce;
  st.local_failed = false;
  st.failure.clear();
  st.status = status_ok;
  // An invalid op goes to the local reducer as is: it fails the collective
  // on every local rank, which keeps the ranks matched.
  self->request(st.cfg.local, st.cfg.timeout, allreduce_atom::value, stage_op(st.cur->op),
                st.cur->tensors)
      .then(
          [self, s](std::vector<tensor>&) {
            if (current(self, s, stage::local_reduce)) after_local(self);
          },
          [self, s](caf::error& e) {
            if (!current(self, s, stage::local_reduce)) return;
            auto& st = self->state;
            auto why = stage_failure(st, "local all-reduce stage", e);
            if (e == caf::sec::request_timeout) {
              go_broken(self, why);
              return;
            }
            st.local_failed = true;
            st.failure = why;
            after_local(self);
          });
}

caf::result<std::vector<tensor>> refuse(self_ptr self, const char* what) {
  auto& st = self->state;
  ++st.stats.collectives;
  ++st.stats.failed;
  return hier_error(std::string("hierarchical reducer: ") + what +
                    " is not supported across processes");
}

reducer_actor::behavior_type hier_fn(self_ptr self, hierarchical_config cfg) {
  keep_exception_cause(self,
                       "hierarchical reducer (local rank " + std::to_string(cfg.local_rank) + ")");
  auto& st = self->state;
  st.cfg = std::move(cfg);
  // A request pending on an actor that died is never answered (only its
  // timeout would end it): watch both and fail at once instead.
  self->monitor(st.cfg.local);
  if (st.cfg.local_rank == 0 && st.cfg.ring) self->monitor(st.cfg.ring);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.cfg.ring && dm.source == st.cfg.ring.address()) {
      if (st.ring_down.empty()) st.ring_down = "ring node is down (" + describe(dm.reason) + ")";
      if (st.cur && st.at == stage::ring)
        on_ring_failed(self, head + "ring stage: " + st.ring_down);
      return;
    }
    if (dm.source == st.cfg.local.address())
      go_broken(self, head + "local reducer is down (" + describe(dm.reason) + ")");
  });
  return {
      [self](allreduce_atom, reduce_op op,
             std::vector<tensor>& ts) -> caf::result<std::vector<tensor>> {
        auto& st = self->state;
        if (!st.broken.empty()) {
          ++st.stats.collectives;
          ++st.stats.failed;
          return hier_error(st.broken);
        }
        auto rp = self->make_response_promise<std::vector<tensor>>();
        st.queue.push_back(job{op, std::move(ts), rp});
        start_next(self);
        return rp;
      },
      [self](reduce_scatter_atom, reduce_op, std::vector<tensor>&)
          -> caf::result<std::vector<tensor>> { return refuse(self, "reduce_scatter"); },
      [self](all_gather_atom, std::vector<tensor>&) -> caf::result<std::vector<tensor>> {
        return refuse(self, "all_gather");
      },
      [self](broadcast_atom, int32_t, std::vector<tensor>&) -> caf::result<std::vector<tensor>> {
        return refuse(self, "broadcast");
      },
      [self](stats_atom) -> reducer_stats { return self->state.stats; },
      // Peer messages of the in-process reducers: nobody sends them here.
      [](reduce_peer_atom, const reduce_peer_msg&) {},
      [](reduce_abort_atom, uint64_t, int32_t, const std::string&) {},
      [](reduce_left_atom, int32_t, const std::string&) {},
      // The owner leaves: the local group fails the collective under way (or
      // the next), and so every rank of the process; nothing later starts.
      [self](reduce_abort_atom, const std::string& reason) {
        self->send(self->state.cfg.local, reduce_abort_atom::value, reason);
        if (!self->state.cur) go_broken(self, "its owner left: " + reason);
      },
  };
}

// The mailbox hand-over made visible to ThreadSanitizer, as for the
// in-process reducers: this actor scales the caller's buffers after the
// local reducers wrote them.
class hier_impl final : public visible_mailbox<reducer_actor::stateful_base<hier_state>> {
 public:
  hier_impl(caf::actor_config& cfg, hierarchical_config hc)
      : visible_mailbox(cfg), hc_(std::move(hc)) {}

  behavior_type make_behavior() override { return hier_fn(this, std::move(hc_)); }

 private:
  hierarchical_config hc_;
};

}  // namespace

reducer_actor spawn_hierarchical_reducer(caf::actor_system& sys, hierarchical_config cfg) {
  if (!cfg.local)
    throw std::invalid_argument("spawn_hierarchical_reducer: the local reducer is null");
  if (cfg.local_rank < 0)
    throw std::invalid_argument("spawn_hierarchical_reducer: local_rank " +
                                std::to_string(cfg.local_rank) + " is negative");
  if (cfg.global_replicas < 1)
    throw std::invalid_argument("spawn_hierarchical_reducer: global_replicas must be >= 1, got " +
                                std::to_string(cfg.global_replicas));
  return sys.spawn<hier_impl>(std::move(cfg));
}

}  // namespace troupe
