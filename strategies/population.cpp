// Population-based training's controller and its protocol (rl.population,
// Jaderberg et al. 2017). The members are actor_learner's learner groups
// (strategies/actor_learner.cpp spawns one learner and one trajectory queue
// per member; rl_actor i acts for member i mod N); the job's driver
// (strategies/actor_learner_driver.cpp) keeps each member's recent returns,
// sends each member's weights to its own actors and, every
// rl.population.interval_env_steps, asks the controller for a round:
//
//   driver --round(scores)--> controller --state--> learner 0 of a top member
//                                        <--(variables, optimizer slots)--
//                                        --exploit(state, hyperparameters)--> every learner of a
//                                        bottom member
//          <--(events, hyperparameters)-- (once every exploit is in)
//
// Exploit is truncation selection: the bottom quantile by mean return takes
// the weights and optimizer state of a member drawn from the top quantile.
// Explore perturbs the copied hyperparameters by a factor (x0.8 / x1.2 by
// default) or, with a probability, draws them afresh. A learner takes an
// exploit between two updates and goes on counting its versions, so its
// actors take the weights it publishes next; a member's learners all take it
// after the same update (actors/learner.cpp), so they stay equal. The driver logs each event
// (a "population" metrics line), starts the bottom member's returns afresh
// and saves the best member as the job's checkpoint.
#include "strategies/population.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "actors/fan_in.hpp"
#include "actors/visible_mailbox.hpp"

namespace troupe {
namespace {

// A draw from the hyperparameter's range: uniform or log-uniform, or one of
// its values.
double draw(const population_hyperparameter& h, splitmix64& rng) {
  const double u = rng.uniform();
  if (h.sampling == "values") return h.values[rng.next() % h.values.size()];
  if (h.sampling == "uniform") return h.min + (h.max - h.min) * u;
  return std::exp(std::log(h.min) + (std::log(h.max) - std::log(h.min)) * u);
}

double explore_one(const population_config& p, const population_hyperparameter& h, double value,
                   splitmix64& rng, std::string& by) {
  if (h.sampling != "job" && p.resample_probability > 0 && rng.uniform() < p.resample_probability) {
    by = "resampled";
    return draw(h, rng);
  }
  by = "perturbed";
  const double out = value * p.factors[rng.next() % p.factors.size()];
  return h.sampling == "job" ? out : std::clamp(out, h.min, h.max);
}

struct controller_state {
  population_controller_config cfg;
  splitmix64 rng{0};
  int64_t rounds = 0;
  static inline const char* name = "population_controller";
};

using controller_ptr = population_controller_actor::stateful_pointer<controller_state>;

void log_event(const population_event& e) {
  spdlog::info(
      "population round {}: member {} (mean return {:.1f}) takes member {}'s weights and "
      "optimizer state (mean return {:.1f}); learning rate {:.3g} -> {:.3g} ({}), entropy cost "
      "{:.3g} -> {:.3g} ({})",
      e.round, e.member, e.member_return, e.source, e.source_return, e.before.learning_rate,
      e.after.learning_rate, e.learning_rate_by, e.before.entropy_cost, e.after.entropy_cost,
      e.entropy_cost_by);
}

// The member's learners take `ms`; then `done`.
void hand_over(controller_ptr self, const model_state& ms, const population_event& e,
               std::function<void(population_event&)> done,
               std::function<void(caf::error&)> failed) {
  const auto& learners = self->state.cfg.members.at(static_cast<std::size_t>(e.member));
  fan_in<int64_t> taken(
      learners.size(),
      [ev = e, done = std::move(done)](std::vector<int64_t>&) mutable {
        log_event(ev);
        done(ev);
      },
      std::move(failed));
  for (std::size_t l = 0; l < learners.size(); ++l)
    self->request(learners[l], self->state.cfg.request_timeout, exploit_atom::value, ms, e.after)
        .then(taken.reply(l), taken.error());
}

// One exploit: the source's state, then the member takes it with the
// explored hyperparameters.
void exploit(controller_ptr self, population_event e, std::function<void(population_event&)> done,
             std::function<void(caf::error&)> failed) {
  auto& st = self->state;
  self->request(st.cfg.members.at(static_cast<std::size_t>(e.source)).front(),
                st.cfg.request_timeout, state_atom::value)
      .then([self, e, done,
             failed](model_state& ms) mutable { hand_over(self, ms, e, std::move(done), failed); },
            failed);
}

caf::result<population_round> run_round(controller_ptr self, std::vector<member_score>& scores) {
  auto& st = self->state;
  const int64_t round = ++st.rounds;
  std::vector<double> returns(st.cfg.hyperparameters.size(), 0);
  for (const auto& s : scores) returns.at(static_cast<std::size_t>(s.member)) = s.mean_return;
  const auto pairs = truncation_pairs(scores, st.cfg.population.quantile, st.rng);
  auto rp = self->make_response_promise<population_round>();
  std::vector<population_event> events;
  for (const auto& [member, source] : pairs) {
    population_event e;
    e.round = round;
    e.member = member;
    e.source = source;
    e.member_return = returns[static_cast<std::size_t>(member)];
    e.source_return = returns[static_cast<std::size_t>(source)];
    e.before = st.cfg.hyperparameters[static_cast<std::size_t>(source)];
    e.after = explore(st.cfg.population, e.before, st.rng, e);
    st.cfg.hyperparameters[static_cast<std::size_t>(member)] = e.after;
    events.push_back(std::move(e));
  }
  fan_in<population_event> done(
      events.size(),
      [self, rp](std::vector<population_event>& all) mutable {
        rp.deliver(population_round{std::move(all), self->state.cfg.hyperparameters});
      },
      [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  for (std::size_t i = 0; i < events.size(); ++i) {
    auto reply = done.reply(i);
    exploit(
        self, events[i], [reply](population_event& e) { reply(e); },
        [err = done.error()](caf::error& e) { err(e); });
  }
  return rp;
}

population_controller_actor::behavior_type population_controller(controller_ptr self,
                                                                 population_controller_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.rng = splitmix64(derive_seed(st.cfg.seed, 0x9b7c0de));
  return {
      [self](round_atom, std::vector<member_score>& scores) { return run_round(self, scores); },
      [self](hyperparameters_atom, std::vector<member_hyperparameters>& hp) -> int64_t {
        auto& st = self->state;
        if (hp.size() != st.cfg.members.size()) return 0;
        st.cfg.hyperparameters = hp;
        for (std::size_t m = 0; m < hp.size(); ++m)
          for (const auto& learner : st.cfg.members[m])
            self->send(learner, hyperparameters_atom::value, hp[m]);
        return static_cast<int64_t>(hp.size());
      },
  };
}

}  // namespace

std::vector<member_hyperparameters> initial_hyperparameters(const population_config& p,
                                                            double learning_rate,
                                                            double entropy_cost, uint64_t seed) {
  splitmix64 rng(derive_seed(seed, 0x9b7));
  auto start = [&rng](const population_hyperparameter& h, double job_value, int64_t m) {
    if (h.sampling == "job") return job_value;
    if (h.sampling == "values") return h.values[static_cast<std::size_t>(m) % h.values.size()];
    return draw(h, rng);
  };
  std::vector<member_hyperparameters> out(static_cast<std::size_t>(p.size));
  for (int64_t m = 0; m < p.size; ++m) {
    auto& h = out[static_cast<std::size_t>(m)];
    h.learning_rate = start(p.learning_rate, learning_rate, m);
    h.entropy_cost = start(p.entropy_cost, entropy_cost, m);
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> truncation_pairs(std::vector<member_score> scores,
                                                          double quantile, splitmix64& rng) {
  scores.erase(std::remove_if(scores.begin(), scores.end(),
                              [](const member_score& s) { return s.episodes <= 0; }),
               scores.end());
  const auto n = static_cast<int64_t>(scores.size());
  if (n < 2) return {};
  // Best first; ties by the lower member index (the same scores, the same pairs).
  std::stable_sort(scores.begin(), scores.end(), [](const member_score& a, const member_score& b) {
    return a.mean_return != b.mean_return ? a.mean_return > b.mean_return : a.member < b.member;
  });
  const int64_t k =
      std::clamp<int64_t>(static_cast<int64_t>(quantile * static_cast<double>(n)), 1, n / 2);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t i = n - k; i < n; ++i) {
    const auto top = static_cast<std::size_t>(rng.next() % static_cast<uint64_t>(k));
    out.emplace_back(scores[static_cast<std::size_t>(i)].member, scores[top].member);
  }
  return out;
}

member_hyperparameters explore(const population_config& p, const member_hyperparameters& from,
                               splitmix64& rng, population_event& event) {
  member_hyperparameters out;
  out.learning_rate =
      explore_one(p, p.learning_rate, from.learning_rate, rng, event.learning_rate_by);
  out.entropy_cost = explore_one(p, p.entropy_cost, from.entropy_cost, rng, event.entropy_cost_by);
  return out;
}

nlohmann::json population_line(const population_event& e, int64_t env_steps) {
  return {{"type", "population"},
          {"round", e.round},
          {"env_steps", env_steps},
          {"member", e.member},
          {"source", e.source},
          {"member_return", e.member_return},
          {"source_return", e.source_return},
          {"learning_rate_before", e.before.learning_rate},
          {"learning_rate", e.after.learning_rate},
          {"learning_rate_by", e.learning_rate_by},
          {"entropy_cost_before", e.before.entropy_cost},
          {"entropy_cost", e.after.entropy_cost},
          {"entropy_cost_by", e.entropy_cost_by}};
}

population_controller_actor spawn_population_controller(caf::actor_system& sys,
                                                        population_controller_config cfg) {
  return spawn_visible<population_controller_actor, controller_state, population_controller_config>(
      sys, population_controller, std::move(cfg));
}

}  // namespace troupe
