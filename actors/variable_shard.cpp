#include "actors/variable_shard.hpp"
#include "actors/failure.hpp"

#include <algorithm>
#include <bit>
#include <set>
#include <stdexcept>

namespace troupe {

namespace {

using self_ptr = variable_shard_actor::stateful_pointer<variable_shard_state>;

constexpr std::size_t histogram_buckets = 16;

std::string who(self_ptr self) {
  return "variable_shard " + std::to_string(self->state.cfg.index) + ": ";
}

caf::error fail(self_ptr self, const std::string& what) {
  ++self->state.stats.rejected;
  return caf::make_error(caf::sec::invalid_argument, who(self) + what);
}

std::string piece_list(const variable_shard_state& st) {
  std::string s;
  for (const auto& v : st.vars) s += (s.empty() ? "" : ", ") + v.name;
  return s;
}

// Gradients reordered to the shard's piece order, or the reason they do not
// fit (naming the piece).
std::string order_grads(const variable_shard_state& st, const std::vector<named_tensor>& grads,
                        std::vector<named_tensor>& out) {
  out.assign(st.vars.size(), {});
  std::vector<bool> seen(st.vars.size(), false);
  for (const auto& g : grads) {
    auto it = st.index_of.find(g.name);
    if (it == st.index_of.end())
      return "gradient '" + g.name + "' is for no piece of this shard (pieces: " + piece_list(st) +
             ")";
    const auto i = it->second;
    if (seen[i]) return "gradient for piece '" + g.name + "' appears twice";
    const auto& v = st.vars[i].value;
    if (g.value.type() != dtype::f32 || g.value.shape() != v.shape())
      return "gradient for piece '" + g.name + "' is " + dtype_name(g.value.type()) +
             shape_string(g.value.shape()) + ", the piece is float32" + shape_string(v.shape());
    seen[i] = true;
    out[i] = g;
  }
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (!seen[i]) return "no gradient for piece '" + st.vars[i].name + "'";
  return {};
}

void record_staleness(variable_shard_state& st, int64_t based_on_version) {
  const int64_t s = std::max<int64_t>(0, st.version - based_on_version);
  st.stats.staleness_max = std::max(st.stats.staleness_max, s);
  st.staleness_sum += static_cast<double>(s);
  ++st.staleness_count;
  const auto bucket = std::min<std::size_t>(
      static_cast<std::size_t>(std::bit_width(static_cast<uint64_t>(s))), histogram_buckets - 1);
  ++st.stats.staleness_histogram[bucket];
}

// One optimizer update. Pulls and snapshots hand out the variables' buffers
// without copying them; a piece handed out since the last update gets a
// fresh buffer before this one writes, so what a puller holds never changes.
// That is one copy per update of a pulled piece, instead of one per pull
// (cloning on pull), and none for pieces nobody pulled: cheaper whenever
// several pulls see one version (aggregate mode, subset pulls) and never
// dearer. Checking the buffers' use counts instead would race with pullers
// that are dropping theirs on other threads.
// A center shard adds the (summed) exchanges instead: c += d, no optimizer.
void apply_update(variable_shard_state& st, const std::vector<named_tensor>& grads) {
  trace::scoped_span span(st.track, "optimizer_update", trace::category::compute);
  for (std::size_t i = 0; i < st.vars.size(); ++i)
    if (st.shared[i]) {
      st.vars[i].value = st.vars[i].value.clone();
      st.shared[i] = false;
    }
  if (st.cfg.center) {
    for (std::size_t i = 0; i < st.vars.size(); ++i) {
      float* c = st.vars[i].value.f32();
      const float* d = grads[i].value.f32();
      const auto n = static_cast<std::size_t>(grads[i].value.numel());
      for (std::size_t k = 0; k < n; ++k) c[k] += d[k];
    }
  } else {
    st.opt->apply(st.vars, grads);
  }
  ++st.version;
  ++st.stats.applies;
}

// Applies the round of `step` (aggregate mode) and answers its pushes.
void apply_round(self_ptr self, int64_t step) {
  auto& st = self->state;
  auto node = st.rounds.extract(step);
  auto& round = node.mapped();
  std::vector<named_tensor> grads;
  for (std::size_t i = 0; i < st.vars.size(); ++i)
    grads.push_back({st.vars[i].name, std::move(round.sum[i])});
  for (auto based : round.based_on) record_staleness(st, based);
  try {
    apply_update(st, grads);
  } catch (const std::exception& e) {
    for (auto& rp : round.promises) rp.deliver(fail(self, e.what()));
    return;
  }
  st.last_applied_step = std::max(st.last_applied_step, step);
  for (auto& rp : round.promises) rp.deliver(st.version);
}

// Applies every gathered step that has enough pushes, lowest step first.
void apply_complete_rounds(self_ptr self) {
  auto& st = self->state;
  std::vector<int64_t> ready;
  for (const auto& [step, round] : st.rounds)
    if (st.aggregate == 0 || static_cast<int64_t>(round.workers.size()) >= st.aggregate)
      ready.push_back(step);
  for (auto step : ready) apply_round(self, step);
}

void init_vars(variable_shard_state& st, std::vector<named_tensor> vars) {
  st.vars = std::move(vars);
  st.index_of.clear();
  for (std::size_t i = 0; i < st.vars.size(); ++i) st.index_of[st.vars[i].name] = i;
  st.shared.assign(st.vars.size(), false);
}

enum class update_kind { gradients, exchange };

// A push (gradients) or an exchange (EASGD deltas): validated, then applied
// on arrival (async), or summed into its step's round and applied when the
// round is complete (aggregate). Answered with the version after the apply
// that included it.
caf::result<int64_t> take_update(self_ptr self, update_kind kind, int64_t worker,
                                 int64_t worker_step, int64_t based_on_version,
                                 const std::vector<named_tensor>& grads) {
  auto& st = self->state;
  const bool exchange = kind == update_kind::exchange;
  const std::string from = (exchange ? "exchange from worker " : "push from worker ") +
                           std::to_string(worker) + (exchange ? " (round " : " (step ") +
                           std::to_string(worker_step) + "): ";
  if (exchange != st.cfg.center)
    return fail(self, from + (st.cfg.center ? "this shard holds the elastic averaging center, "
                                              "which takes exchanges, not gradients"
                                            : "this shard's variables are updated by gradients; "
                                              "only a center shard takes exchanges"));
  if (based_on_version < 0 || based_on_version > st.version)
    return fail(self, from + "based on version " + std::to_string(based_on_version) +
                          ", the shard is at version " + std::to_string(st.version) +
                          " (pull again)");
  std::vector<named_tensor> ordered;
  if (auto why = order_grads(st, grads, ordered); !why.empty()) return fail(self, from + why);
  auto accept = [&] {
    ++st.stats.pushes;
    for (const auto& g : ordered) st.stats.bytes_in += static_cast<int64_t>(g.value.nbytes());
  };
  // An exchange for a round applied without it (its contributors were
  // lowered after another one's was in) is applied alone: exchanges add up.
  const bool late = st.aggregate > 0 && exchange &&
                    st.rounds.find(worker_step) == st.rounds.end() &&
                    worker_step <= st.last_applied_step;
  if (st.aggregate == 0 || late) {
    accept();
    record_staleness(st, based_on_version);
    try {
      apply_update(st, ordered);
    } catch (const std::exception& e) {
      return fail(self, from + e.what());
    }
    return st.version;
  }
  auto it = st.rounds.find(worker_step);
  if (it == st.rounds.end() && worker_step <= st.last_applied_step)
    return fail(self, from + "step " + std::to_string(worker_step) +
                          " was already applied (last applied step " +
                          std::to_string(st.last_applied_step) + ")");
  if (it == st.rounds.end()) {
    it = st.rounds.emplace(worker_step, shard_round{}).first;
    // The shard's own buffers: the pushers keep theirs.
    for (const auto& g : ordered) it->second.sum.push_back(g.value.clone());
  } else {
    auto& w = it->second.workers;
    if (std::find(w.begin(), w.end(), worker) != w.end())
      return fail(self,
                  from + "this worker already pushed for step " + std::to_string(worker_step));
    for (std::size_t i = 0; i < ordered.size(); ++i) {
      float* acc = it->second.sum[i].f32();
      const float* g = ordered[i].value.f32();
      const auto n = static_cast<std::size_t>(ordered[i].value.numel());
      for (std::size_t k = 0; k < n; ++k) acc[k] += g[k];
    }
  }
  accept();
  it->second.workers.push_back(worker);
  it->second.based_on.push_back(based_on_version);
  auto rp = self->make_response_promise<int64_t>();
  it->second.promises.push_back(rp);
  if (static_cast<int64_t>(it->second.workers.size()) >= st.aggregate)
    apply_round(self, worker_step);
  return rp;
}

}  // namespace

variable_shard_actor::behavior_type variable_shard(self_ptr self, variable_shard_config cfg) {
  keep_exception_cause(self, "variable_shard " + std::to_string(cfg.index));
  auto& st = self->state;
  std::vector<named_tensor> vars;
  for (const auto& p : cfg.pieces) vars.push_back({p.name, p.value.clone()});
  cfg.pieces.clear();
  st.aggregate = cfg.aggregate;
  st.opt = std::make_unique<kernels::optimizer>(cfg.optimizer, cfg.total_steps);
  st.cfg = std::move(cfg);
  init_vars(st, std::move(vars));
  st.opt->init(st.vars);
  st.stats.staleness_histogram.assign(histogram_buckets, 0);
  st.track = trace::track("variable_shard:" + std::to_string(st.cfg.index));
  return {
      [self](pull_atom, const std::vector<std::string>& names) -> caf::result<shard_values> {
        auto& st = self->state;
        trace::scoped_span span(st.track, "pull", trace::category::communicate);
        shard_values r{st.version, {}};
        std::vector<std::size_t> which;
        if (names.empty()) {
          for (std::size_t i = 0; i < st.vars.size(); ++i) which.push_back(i);
        } else {
          for (const auto& n : names) {
            auto it = st.index_of.find(n);
            if (it == st.index_of.end())
              return fail(self, "pull: no piece '" + n +
                                    "' on this shard (pieces: " + piece_list(st) + ")");
            which.push_back(it->second);
          }
        }
        for (auto i : which) {
          st.shared[i] = true;
          st.stats.bytes_out += static_cast<int64_t>(st.vars[i].value.nbytes());
          r.values.push_back(st.vars[i]);
        }
        ++st.stats.pulls;
        return r;
      },
      [self](push_atom, int64_t worker, int64_t worker_step, int64_t based_on_version,
             const std::vector<named_tensor>& grads) -> caf::result<int64_t> {
        trace::scoped_span span(self->state.track, "push", trace::category::communicate,
                                {worker_step, -1, -1});
        return take_update(self, update_kind::gradients, worker, worker_step, based_on_version,
                           grads);
      },
      [self](exchange_atom, int64_t worker, int64_t round, int64_t based_on_version,
             const std::vector<named_tensor>& deltas) -> caf::result<int64_t> {
        trace::scoped_span span(self->state.track, "exchange", trace::category::communicate,
                                {round, -1, -1});
        return take_update(self, update_kind::exchange, worker, round, based_on_version, deltas);
      },
      [self](aggregate_atom, int64_t k) -> caf::result<int64_t> {
        if (k < 0)
          return fail(self,
                      "aggregate: contributors per step must be >= 0, got " + std::to_string(k));
        auto old = self->state.aggregate;
        self->state.aggregate = k;
        apply_complete_rounds(self);
        return old;
      },
      [self](state_atom) -> shard_state {
        auto& st = self->state;
        std::fill(st.shared.begin(), st.shared.end(), true);
        return {st.version, st.vars, st.opt->state()};
      },
      [self](restore_atom, const shard_state& s) -> caf::result<int64_t> {
        auto& st = self->state;
        if (s.version < 0)
          return fail(self, "restore: negative version " + std::to_string(s.version));
        std::vector<named_tensor> vars(st.vars.size());
        std::vector<bool> seen(st.vars.size(), false);
        for (const auto& v : s.variables) {
          auto it = st.index_of.find(v.name);
          if (it == st.index_of.end())
            return fail(self, "restore: piece '" + v.name + "' does not belong to this shard");
          const auto& mine = st.vars[it->second].value;
          if (v.value.type() != dtype::f32 || v.value.shape() != mine.shape())
            return fail(self, "restore: piece '" + v.name + "' is " + dtype_name(v.value.type()) +
                                  shape_string(v.value.shape()) + ", expected float32" +
                                  shape_string(mine.shape()));
          seen[it->second] = true;
          vars[it->second] = {v.name, v.value.clone()};
        }
        for (std::size_t i = 0; i < seen.size(); ++i)
          if (!seen[i]) return fail(self, "restore: piece '" + st.vars[i].name + "' is missing");
        auto opt = std::make_unique<kernels::optimizer>(st.cfg.optimizer, st.cfg.total_steps);
        opt->init(vars);
        if (!s.slots.empty()) {
          try {
            opt->load_state(s.slots);
          } catch (const std::exception& e) {
            return fail(self, std::string("restore: ") + e.what());
          }
        }
        for (auto& [step, round] : st.rounds)
          for (auto& rp : round.promises)
            rp.deliver(fail(self, "step " + std::to_string(step) +
                                      " was dropped: the shard was restored from a checkpoint"));
        st.rounds.clear();
        st.last_applied_step = -1;
        init_vars(st, std::move(vars));
        st.opt = std::move(opt);
        st.version = s.version;
        return st.version;
      },
      [self](stats_atom) -> shard_stats {
        auto& st = self->state;
        shard_stats r = st.stats;
        r.version = st.version;
        r.staleness_mean =
            st.staleness_count ? st.staleness_sum / static_cast<double>(st.staleness_count) : 0.0;
        return r;
      },
  };
}

variable_shard_actor spawn_variable_shard(caf::actor_system& sys, variable_shard_config cfg) {
  const std::string who = "variable_shard " + std::to_string(cfg.index) + ": ";
  // Throws on an unknown optimizer or schedule kind before anything runs.
  kernels::optimizer check(cfg.optimizer, cfg.total_steps);
  if (cfg.aggregate < 0)
    throw std::invalid_argument(who + "aggregate must be >= 0, got " +
                                std::to_string(cfg.aggregate));
  std::set<std::string> names;
  for (const auto& p : cfg.pieces) {
    if (!names.insert(p.name).second)
      throw std::invalid_argument(who + "piece '" + p.name + "' given twice");
    if (p.value.type() != dtype::f32)
      throw std::invalid_argument(who + "piece '" + p.name + "' is " + dtype_name(p.value.type()) +
                                  ", expected float32");
  }
  if (cfg.detached) return sys.spawn<caf::detached>(variable_shard, std::move(cfg));
  return sys.spawn(variable_shard, std::move(cfg));
}

}  // namespace troupe
