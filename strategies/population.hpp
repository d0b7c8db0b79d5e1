#pragma once
// Population-based training (rl.population; Jaderberg et al. 2017) on the
// actor_learner setup: N members, each rl.learners data-parallel learners
// with their own trajectory queue, its own share of the rl_actors and its own hyperparameters
// (learning rate, entropy cost). The population controller, an actor beside
// the learners, is told the members' scores every rl.population.
// interval_env_steps environment steps and answers once the round's exploits
// are done (the protocol is in strategies/population.cpp). The pure parts,
// the draws, the selection and the perturbation, are here to be tested.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "config/job_config.hpp"
#include "messages/rl_messages.hpp"
#include "models/random.hpp"

namespace troupe {

// Each member's starting hyperparameters: the job's own values
// (optimizer.learning_rate, rl.entropy_cost) where the population sets
// none, else its values or draws from `seed` (the same seed, the same draws).
std::vector<member_hyperparameters> initial_hyperparameters(const population_config& p,
                                                            double learning_rate,
                                                            double entropy_cost, uint64_t seed);

// Truncation selection: the members with episodes, ranked by mean return;
// each of the bottom floor(quantile * n) (at least 1, at most n / 2) is
// paired with one of as many at the top, drawn from `rng`.
// Answered as (member, source) pairs; none with fewer than two ranked.
std::vector<std::pair<int64_t, int64_t>> truncation_pairs(std::vector<member_score> scores,
                                                          double quantile, splitmix64& rng);

// Explore: `from`'s hyperparameters, each multiplied by one of the factors
// (kept inside its range) or, with the resample probability, drawn afresh;
// how each one changed goes into `event`'s *_by fields.
member_hyperparameters explore(const population_config& p, const member_hyperparameters& from,
                               splitmix64& rng, population_event& event);

// The JSON metrics line of one exploit and explore ("type": "population").
nlohmann::json population_line(const population_event& e, int64_t env_steps);

struct population_controller_config {
  population_config population;
  uint64_t seed = 0;
  // Each member's learners (rl.learners of them, in lockstep): a member's
  // state is read from its first; an exploit goes to all of them.
  std::vector<std::vector<learner_actor>> members;
  std::vector<member_hyperparameters> hyperparameters;  // each member's, at the start
  caf::duration request_timeout = caf::infinite;
};

population_controller_actor spawn_population_controller(caf::actor_system& sys,
                                                        population_controller_config cfg);

}  // namespace troupe
