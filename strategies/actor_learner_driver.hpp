#pragma once
// actor_learner's side of the job's coordinator: it starts the learners and
// rl_actors (after the learners restored a checkpoint), forwards learner 0's
// weights to every live actor, counts environment steps, episodes and the
// mean return of the last 100 episodes (the progress measure), books each
// update, and stops the job at training.max_env_steps or once that mean
// reaches training.target_return (training.max_steps is the coordinator's).
// A lost rl_actor is logged and the job goes on without it (one that rejoins
// gets the current weights); with central inference (a server given) the
// first weights go to the server instead and the actors get none; a lost
// learner or queue ends the job.
//
// With rl.population (strategies/population.cpp) the job has N members,
// each a learner with its own queue: rl_actor i acts for member i mod N and
// gets that member's weights; the returns are kept per member, the best
// member's mean is the job's measure and its state the job's checkpoint, and
// every rl.population.interval_env_steps the population controller gets a
// round (each exploit is logged and written as a "population" metrics line).
#include <memory>
#include <vector>

#include "actors/strategy_api.hpp"
#include "messages/rl_messages.hpp"

namespace troupe {

// What actor_learner's hub spawned in the chief's process.
struct actor_learner_parts {
  // Each member's learners (one member outside a population).
  std::vector<std::vector<learner_actor>> members;
  std::vector<trajectory_queue_actor> queues;           // one per member
  inference_server_actor server;                        // central inference only
  population_controller_actor controller;               // rl.population only
  std::vector<member_hyperparameters> hyperparameters;  // rl.population: each member's start
};

std::unique_ptr<job_driver> make_actor_learner_driver(const job_plan& plan,
                                                      actor_learner_parts parts,
                                                      std::vector<rl_actor_actor> actors);

}  // namespace troupe
