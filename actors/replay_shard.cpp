#include "actors/replay_shard.hpp"
#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "actors/visible_mailbox.hpp"

namespace troupe {
namespace {

using self_ptr = replay_shard_actor::stateful_pointer<replay_shard_state>;

void copy_row(const float* from, int64_t row, int64_t width, std::vector<float>& to, int64_t slot) {
  std::copy(from + row * width, from + (row + 1) * width, to.begin() + slot * width);
}

// Batch row `row` into slot `slot`.
void store_row(replay_storage& s, const transition_batch& b, int64_t row, int64_t slot, int64_t O) {
  copy_row(b.observations.f32(), row, O, s.observations, slot);
  copy_row(b.next_observations.f32(), row, O, s.next_observations, slot);
  const auto k = static_cast<std::size_t>(slot);
  s.actions[k] = b.actions.data<int32_t>()[row];
  s.returns[k] = b.returns.f32()[row];
  s.discounts[k] = b.discounts.f32()[row];
}

// Slot `slot` into batch row `row`.
void load_row(const replay_storage& s, int64_t slot, transition_batch& b, int64_t row, int64_t O) {
  const auto k = static_cast<std::size_t>(slot);
  std::copy_n(s.observations.begin() + slot * O, O, b.observations.f32() + row * O);
  std::copy_n(s.next_observations.begin() + slot * O, O, b.next_observations.f32() + row * O);
  b.actions.data<int32_t>()[row] = s.actions[k];
  b.returns.f32()[row] = s.returns[k];
  b.discounts.f32()[row] = s.discounts[k];
}

// Transitions go into the ring in insertion order: transition `id` lives in
// slot id % capacity until `capacity` later ones overwrite it.
void insert(replay_shard_state& st, const transition_batch& b) {
  const int64_t C = st.cfg.capacity, O = st.cfg.observation_size;
  for (int64_t r = 0; r < b.size(); ++r) {
    const int64_t slot = st.stats.inserted % C;
    if (st.stats.inserted >= C) ++st.stats.evicted;
    store_row(st.store, b, r, slot, O);
    st.tree.set(slot, b.priorities.f32()[r]);
    ++st.stats.inserted;
  }
  st.stats.size = std::min(st.stats.inserted, C);
}

// n draws, one from each of n equal strata of the priority mass (as Ape-X
// does): lower variance than n independent draws, the same distribution.
replay_sample draw(replay_shard_state& st, int64_t n) {
  const int64_t O = st.cfg.observation_size, C = st.cfg.capacity;
  replay_sample out;
  auto& t = out.transitions;
  t.observations = tensor::uninitialized({n, O});
  t.next_observations = tensor::uninitialized({n, O});
  t.actions = tensor::uninitialized({n}, dtype::i32);
  t.returns = tensor::uninitialized({n});
  t.discounts = tensor::uninitialized({n});
  out.weights = tensor::uninitialized({n});
  out.ids.resize(static_cast<std::size_t>(n));
  // The ring's oldest id: ids below it have been overwritten.
  const int64_t first = st.stats.inserted - st.stats.size;
  for (int64_t k = 0; k < n; ++k) {
    const double u = (static_cast<double>(k) + st.rng.uniform()) / static_cast<double>(n);
    const int64_t slot = st.tree.find(std::min(u, std::nextafter(1.0, 0.0)));
    load_row(st.store, slot, t, k, O);
    out.weights.f32()[k] = static_cast<float>(st.tree.weight(slot, st.cfg.beta));
    // The one held id in [first, inserted) that lives in this slot.
    out.ids[static_cast<std::size_t>(k)] = first + (slot - first % C + C) % C;
  }
  st.stats.sampled += n;
  return out;
}

// Whether an insert that brought the count to `inserted` may be answered.
bool within_rate(const replay_shard_state& st, int64_t inserted) {
  const double spi = st.cfg.samples_per_insert;
  if (spi <= 0 || inserted <= st.cfg.min_size) return true;
  return static_cast<double>(st.stats.sampled) >=
         spi * static_cast<double>(inserted - st.cfg.min_size);
}

// Answers the inserts the rate limiter held, oldest first, as far as
// samples allow.
void release_held(replay_shard_state& st) {
  while (!st.held.empty() && within_rate(st, st.held.front().first)) {
    st.held.front().second.deliver(st.stats.size);
    st.held.pop_front();
  }
}

// Ids the ring still holds get their new priority; others are counted.
void update_priorities(replay_shard_state& st, const priority_update& u) {
  const int64_t first = st.stats.inserted - st.stats.size;
  const std::size_t n = std::min(u.ids.size(), u.priorities.size());
  for (std::size_t k = 0; k < n; ++k) {
    const int64_t id = u.ids[k];
    const float p = u.priorities[k];
    if (id < first || id >= st.stats.inserted || !(p >= 0) || !std::isfinite(p)) {
      ++st.stats.stale_updates;
      continue;
    }
    st.tree.set(id % st.cfg.capacity, p);
    ++st.stats.updated;
  }
}

caf::error refuse(self_ptr self, const std::string& why) {
  ++self->state.stats.refused;
  const auto msg = "replay_shard " + std::to_string(self->state.cfg.index) + ": " + why;
  spdlog::warn("{}", msg);
  return caf::make_error(caf::sec::invalid_argument, msg);
}

}  // namespace

replay_shard_actor::behavior_type replay_shard(self_ptr self, replay_shard_config cfg) {
  keep_exception_cause(self, "replay_shard " + std::to_string(cfg.index));
  auto& st = self->state;
  st.cfg = cfg;
  st.tree = sum_tree(cfg.capacity, cfg.alpha);
  st.rng = splitmix64(derive_seed(cfg.seed, 7000 + static_cast<uint64_t>(cfg.index)));
  const auto C = static_cast<std::size_t>(cfg.capacity);
  const auto O = static_cast<std::size_t>(cfg.observation_size);
  st.store = {std::vector<float>(C * O), std::vector<float>(C * O), std::vector<int32_t>(C),
              std::vector<float>(C), std::vector<float>(C)};
  st.stats.capacity = cfg.capacity;
  return {
      [self](insert_atom, transition_batch& b) -> caf::result<int64_t> {
        auto& st = self->state;
        if (auto why = transition_problem(b, st.cfg.observation_size, st.cfg.actions); !why.empty())
          return refuse(self, "refused an insert: " + why);
        insert(st, b);
        if (st.held.empty() && within_rate(st, st.stats.inserted)) return st.stats.size;
        auto rp = self->make_response_promise<int64_t>();
        st.held.emplace_back(st.stats.inserted, rp);
        return rp;
      },
      [self](sample_atom, int64_t n) -> caf::result<replay_sample> {
        auto& st = self->state;
        if (n < 1) return refuse(self, "a sample of " + std::to_string(n) + " transitions");
        // Not ready: an empty sample at once rather than a wait, so that a
        // learner can turn to a shard that is (waiting here could deadlock
        // with actors held by another shard's rate limiter).
        if (st.stats.size < st.cfg.min_size || st.tree.size() == 0) return replay_sample{};
        auto out = draw(st, n);
        release_held(st);
        return out;
      },
      [self](priority_atom, const priority_update& u) { update_priorities(self->state, u); },
      [self](stats_atom) -> replay_stats { return self->state.stats; },
  };
}

replay_shard_actor spawn_replay_shard(caf::actor_system& sys, replay_shard_config cfg) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("replay_shard " + std::to_string(cfg.index) + ": " + why);
  };
  if (cfg.capacity < 1) throw bad("capacity must be >= 1, got " + std::to_string(cfg.capacity));
  if (!(cfg.alpha >= 0) || !std::isfinite(cfg.alpha))
    throw bad("alpha must be finite and >= 0, got " + std::to_string(cfg.alpha));
  if (!(cfg.beta >= 0 && cfg.beta <= 1))
    throw bad("beta must be in [0, 1], got " + std::to_string(cfg.beta));
  if (cfg.min_size < 1 || cfg.min_size > cfg.capacity)
    throw bad("min_size must be in [1, capacity], got " + std::to_string(cfg.min_size));
  if (!(cfg.samples_per_insert >= 0) || !std::isfinite(cfg.samples_per_insert))
    throw bad("samples_per_insert must be finite and >= 0, got " +
              std::to_string(cfg.samples_per_insert));
  if (cfg.observation_size < 1 || cfg.actions < 1)
    throw bad("observation_size and actions must be >= 1");
  return spawn_visible<replay_shard_actor, replay_shard_state, replay_shard_config>(
      sys, replay_shard, cfg);
}

}  // namespace troupe
