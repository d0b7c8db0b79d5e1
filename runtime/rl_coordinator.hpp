#pragma once
// The coordinator of an actor/learner job (strategies/actor_learner.cpp): it
// starts the learners and rl_actors (after restoring a checkpoint), forwards
// learner 0's weights to every live actor, counts environment steps, episodes
// and updates, writes the metrics lines, checkpoints and progress, and stops
// the job at training.max_steps (updates), training.max_env_steps or once the
// mean return of the last 100 episodes reaches training.target_return. A lost
// rl_actor is logged and the job goes on without it (one that rejoins gets the
// current weights); a lost learner or queue ends the job naming it.
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/job_plan.hpp"
#include "messages/rl_messages.hpp"

namespace troupe {

struct rl_coordinator_state {
  std::shared_ptr<const job_plan> plan;
  std::vector<learner_actor> learners;
  std::vector<rl_actor_actor> actors;  // by index; null while lost
  trajectory_queue_actor queue;
  caf::typed_response_promise<std::string> done;
  std::ofstream metrics;
  std::chrono::steady_clock::time_point started;
  bool running = false, stopping = false, finished = false;
  // Figures since the start of the job (a resumed job: since the first run).
  int64_t updates = 0, env_steps = 0, episodes = 0, samples = 0;
  int64_t start_updates = 0, start_env_steps = 0;
  std::deque<double> recent;  // returns of the last 100 episodes
  // Environments start together, so the first episodes to end are the
  // shortest: the job is not declared solved before every environment could
  // have ended its first episode (environments x max_episode_steps steps).
  int64_t min_env_steps_to_solve = 0;
  double best_mean_return = -1e300;
  double time_to_solve = -1;
  int64_t env_steps_to_solve = 0;
  std::string stop_reason;
  // Since the last metrics line.
  struct interval {
    double t = 0;
    int64_t updates = 0, env_steps = 0, samples = 0, reports = 0;
    double loss = 0, policy_loss = 0, baseline_loss = 0, entropy = 0, grad_norm = 0, lag = 0;
    int64_t lag_max = 0;
  } since;
  queue_stats last_queue;
  std::optional<policy_weights> latest;
  int64_t next_checkpoint = 0;
  bool checkpointing = false;
  std::string last_checkpoint;
  static inline const char* name = "rl_coordinator";
};

rl_coordinator_actor::behavior_type rl_coordinator(
    rl_coordinator_actor::stateful_pointer<rl_coordinator_state> self,
    std::shared_ptr<const job_plan> plan);

// The mean return of the last 100 episodes (of fewer when fewer ended).
double mean_recent_return(const std::deque<double>& recent);

}  // namespace troupe
