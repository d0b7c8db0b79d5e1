#include "messages/rl_messages.hpp"

namespace troupe {

void register_rl_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<unroll>("troupe::unroll");
  cfg.add_message_type<std::vector<unroll>>("std::vector<troupe::unroll>");
  cfg.add_message_type<queue_stats>("troupe::queue_stats");
  cfg.add_message_type<trajectory_queue_actor>("troupe::trajectory_queue_actor");
  cfg.add_message_type<policy_weights>("troupe::policy_weights");
  cfg.add_message_type<episode_report>("troupe::episode_report");
  cfg.add_message_type<learner_report>("troupe::learner_report");
  cfg.add_message_type<rl_actor_actor>("troupe::rl_actor_actor");
  cfg.add_message_type<learner_actor>("troupe::learner_actor");
  cfg.add_message_type<rl_coordinator_actor>("troupe::rl_coordinator_actor");
  cfg.add_message_type<std::vector<learner_actor>>("std::vector<troupe::learner_actor>");
  cfg.add_message_type<std::vector<rl_actor_actor>>("std::vector<troupe::rl_actor_actor>");
}

}  // namespace troupe
