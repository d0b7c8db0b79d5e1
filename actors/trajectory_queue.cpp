#include "actors/trajectory_queue.hpp"
#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

#include "actors/visible_mailbox.hpp"

#include <stdexcept>
#include <string>

namespace troupe {
namespace {

using self_ptr = trajectory_queue_actor::stateful_pointer<trajectory_queue_state>;

bool stale(const trajectory_queue_state& st, const unroll& u) {
  return st.cfg.max_policy_lag >= 0 &&
         st.stats.policy_version - u.policy_version > st.cfg.max_policy_lag;
}

// Drops queued unrolls that became stale (oldest first; versions only grow).
void drop_stale(trajectory_queue_state& st) {
  for (auto it = st.queued.begin(); it != st.queued.end();) {
    if (stale(st, *it)) {
      it = st.queued.erase(it);
      ++st.stats.dropped_stale;
    } else {
      ++it;
    }
  }
}

// Moves work along: serve learners whose batch is there, then let held-back
// actors in while there is room; repeat until nothing moves.
void settle(self_ptr self) {
  auto& st = self->state;
  drop_stale(st);
  for (bool moved = true; moved;) {
    moved = false;
    while (!st.consumers.empty() &&
           static_cast<int64_t>(st.queued.size()) >= st.consumers.front().first) {
      auto [n, rp] = std::move(st.consumers.front());
      st.consumers.pop_front();
      std::vector<unroll> batch;
      batch.reserve(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        batch.push_back(std::move(st.queued.front()));
        st.queued.pop_front();
      }
      st.stats.dequeued += n;
      rp.deliver(std::move(batch));
      moved = true;
    }
    while (!st.producers.empty() && static_cast<int64_t>(st.queued.size()) < st.cfg.capacity) {
      auto [u, rp] = std::move(st.producers.front());
      st.producers.pop_front();
      if (stale(st, u)) {
        ++st.stats.dropped_stale;
        rp.deliver(int64_t{-1});
        continue;
      }
      st.queued.push_back(std::move(u));
      ++st.stats.enqueued;
      rp.deliver(static_cast<int64_t>(st.queued.size()));
      moved = true;
    }
  }
}

}  // namespace

trajectory_queue_actor::behavior_type trajectory_queue(self_ptr self, trajectory_queue_config cfg) {
  keep_exception_cause(self, "trajectory queue");
  self->state.cfg = cfg;
  self->state.stats.capacity = cfg.capacity;
  return {
      [self](enqueue_atom, unroll& u) -> caf::result<int64_t> {
        auto& st = self->state;
        if (st.cfg.expect.steps > 0) {
          if (auto why = unroll_problem(u, st.cfg.expect); !why.empty()) {
            ++st.stats.refused;
            const auto msg = "trajectory_queue: refused an unroll from actor " +
                             std::to_string(u.actor) + ": " + why;
            spdlog::warn("{}", msg);
            return caf::make_error(caf::sec::invalid_argument, msg);
          }
        }
        if (stale(st, u)) {
          ++st.stats.dropped_stale;
          return int64_t{-1};
        }
        auto rp = self->make_response_promise<int64_t>();
        st.producers.emplace_back(std::move(u), rp);
        settle(self);
        return rp;
      },
      [self](dequeue_atom, int64_t n) -> caf::result<std::vector<unroll>> {
        auto& st = self->state;
        if (n < 1 || n > st.cfg.capacity)
          return caf::make_error(caf::sec::invalid_argument,
                                 "trajectory_queue: a batch of " + std::to_string(n) +
                                     " unrolls can never be served (capacity " +
                                     std::to_string(st.cfg.capacity) + ")");
        auto rp = self->make_response_promise<std::vector<unroll>>();
        st.consumers.emplace_back(n, rp);
        settle(self);
        return rp;
      },
      [self](version_atom, int64_t v) {
        auto& st = self->state;
        st.stats.policy_version = std::max(st.stats.policy_version, v);
        settle(self);
      },
      [self](stats_atom) -> queue_stats {
        auto& st = self->state;
        auto s = st.stats;
        s.depth = static_cast<int64_t>(st.queued.size());
        s.waiting_producers = static_cast<int64_t>(st.producers.size());
        s.waiting_consumers = static_cast<int64_t>(st.consumers.size());
        return s;
      },
  };
}

trajectory_queue_actor spawn_trajectory_queue(caf::actor_system& sys, trajectory_queue_config cfg) {
  if (cfg.capacity < 1)
    throw std::invalid_argument("trajectory_queue: capacity must be >= 1, got " +
                                std::to_string(cfg.capacity));
  if (cfg.max_policy_lag < -1)
    throw std::invalid_argument(
        "trajectory_queue: max_policy_lag must be >= 0 or -1 (keep all), got " +
        std::to_string(cfg.max_policy_lag));
  const auto& e = cfg.expect;
  if (e.steps != 0 &&
      (e.steps < 1 || e.envs < 1 || e.observation_size < 1 || (e.actions < 1 && e.action_dims < 1)))
    throw std::invalid_argument(
        "trajectory_queue: the expected unroll shape needs steps, envs, "
        "observation_size and actions (or action_dims) >= 1");
  return spawn_visible<trajectory_queue_actor, trajectory_queue_state, trajectory_queue_config>(
      sys, trajectory_queue, cfg);
}

}  // namespace troupe
