#pragma once
// actor_learner's side of the job's coordinator: it starts the learners and
// rl_actors (after the learners restored a checkpoint), forwards learner 0's
// weights to every live actor, counts environment steps, episodes and the
// mean return of the last 100 episodes (the progress measure), books each
// update, and stops the job at training.max_env_steps or once that mean
// reaches training.target_return (training.max_steps is the coordinator's).
// A lost rl_actor is logged and the job goes on without it (one that rejoins
// gets the current weights); with central inference (a server given) the
// first weights go to the server instead and the actors get none; a lost learner or queue ends the
// job.
#include <memory>
#include <vector>

#include "actors/strategy_api.hpp"
#include "messages/rl_messages.hpp"

namespace troupe {

std::unique_ptr<job_driver> make_actor_learner_driver(const job_plan& plan,
                                                      std::vector<learner_actor> learners,
                                                      std::vector<rl_actor_actor> actors,
                                                      trajectory_queue_actor queue,
                                                      inference_server_actor server = {});

}  // namespace troupe
