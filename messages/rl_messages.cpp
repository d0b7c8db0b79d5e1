#include "messages/rl_messages.hpp"

#include "messages/coordinator_messages.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace troupe {

namespace {

std::string shape_problem(const tensor& t, const shape_t& want, dtype type, const char* what) {
  if (t.shape() == want && t.type() == type) return {};
  return std::string(what) + " has shape " + shape_string(t.shape()) + " " + dtype_name(t.type()) +
         ", expected " + shape_string(want) + " " + dtype_name(type);
}

template <class T>
std::string range_problem(const tensor& t, const char* what, T lo, T hi) {
  const T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!(p[i] >= lo && p[i] <= hi))
      return std::string(what) + "[" + std::to_string(i) + "] is " + std::to_string(p[i]) +
             ", expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return {};
}

std::string finite_problem(const tensor& t, const char* what) {
  const float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(p[i]))
      return std::string(what) + "[" + std::to_string(i) + "] is not a finite number";
  return {};
}

}  // namespace

std::string unroll_problem(const unroll& u, const unroll_shape& s) {
  const int64_t T = s.steps, M = s.envs, O = s.observation_size, D = s.action_dims;
  const bool box = D > 0;
  const int64_t P = box ? 2 * D : s.actions;  // policy outputs per step
  for (auto p : {shape_problem(u.observations, {T + 1, M, O}, dtype::f32, "observations"),
                 box ? shape_problem(u.actions, {T, M, D}, dtype::f32, "actions")
                     : shape_problem(u.actions, {T, M}, dtype::i32, "actions"),
                 shape_problem(u.rewards, {T, M}, dtype::f32, "rewards"),
                 shape_problem(u.terminated, {T, M}, dtype::i32, "terminated"),
                 shape_problem(u.truncated, {T, M}, dtype::i32, "truncated"),
                 shape_problem(u.final_observations, {T, M, O}, dtype::f32, "final_observations"),
                 shape_problem(u.behaviour_logits, {T, M, P}, dtype::f32, "behaviour_logits")})
    if (!p.empty()) return p;
  for (auto p :
       {box ? finite_problem(u.actions, "actions")
            : range_problem<int32_t>(u.actions, "actions", 0, static_cast<int32_t>(s.actions - 1)),
        range_problem<int32_t>(u.terminated, "terminated", 0, 1),
        range_problem<int32_t>(u.truncated, "truncated", 0, 1),
        finite_problem(u.observations, "observations"), finite_problem(u.rewards, "rewards"),
        finite_problem(u.final_observations, "final_observations"),
        finite_problem(u.behaviour_logits, "behaviour_logits")})
    if (!p.empty()) return p;
  if (u.policy_version < 0) return "policy_version is " + std::to_string(u.policy_version);
  return {};
}

std::string transition_problem(const transition_batch& b, int64_t observation_size,
                               int64_t actions) {
  const int64_t B = b.size(), O = observation_size;
  if (B < 1)
    return "actions has shape " + shape_string(b.actions.shape()) + ", expected [B] (B >= 1)";
  for (auto p : {shape_problem(b.observations, {B, O}, dtype::f32, "observations"),
                 shape_problem(b.actions, {B}, dtype::i32, "actions"),
                 shape_problem(b.returns, {B}, dtype::f32, "returns"),
                 shape_problem(b.discounts, {B}, dtype::f32, "discounts"),
                 shape_problem(b.next_observations, {B, O}, dtype::f32, "next_observations"),
                 shape_problem(b.priorities, {B}, dtype::f32, "priorities")})
    if (!p.empty()) return p;
  for (auto p :
       {range_problem<int32_t>(b.actions, "actions", 0, static_cast<int32_t>(actions - 1)),
        range_problem<float>(b.discounts, "discounts", 0.0f, 1.0f),
        range_problem<float>(b.priorities, "priorities", 0.0f, std::numeric_limits<float>::max()),
        finite_problem(b.observations, "observations"), finite_problem(b.returns, "returns"),
        finite_problem(b.next_observations, "next_observations")})
    if (!p.empty()) return p;
  return {};
}

void register_rl_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<transition_batch>("troupe::transition_batch");
  cfg.add_message_type<replay_sample>("troupe::replay_sample");
  cfg.add_message_type<priority_update>("troupe::priority_update");
  cfg.add_message_type<replay_stats>("troupe::replay_stats");
  cfg.add_message_type<replay_shard_actor>("troupe::replay_shard_actor");
  cfg.add_message_type<std::vector<replay_shard_actor>>("std::vector<troupe::replay_shard_actor>");
  cfg.add_message_type<unroll>("troupe::unroll");
  cfg.add_message_type<inference_request>("troupe::inference_request");
  cfg.add_message_type<inference_reply>("troupe::inference_reply");
  cfg.add_message_type<inference_stats>("troupe::inference_stats");
  cfg.add_message_type<inference_server_actor>("troupe::inference_server_actor");
  cfg.add_message_type<std::vector<unroll>>("std::vector<troupe::unroll>");
  cfg.add_message_type<queue_stats>("troupe::queue_stats");
  cfg.add_message_type<trajectory_queue_actor>("troupe::trajectory_queue_actor");
  cfg.add_message_type<policy_weights>("troupe::policy_weights");
  cfg.add_message_type<episode_report>("troupe::episode_report");
  cfg.add_message_type<learner_report>("troupe::learner_report");
  cfg.add_message_type<rl_actor_actor>("troupe::rl_actor_actor");
  cfg.add_message_type<learner_actor>("troupe::learner_actor");
  cfg.add_message_type<rl_reports_actor>("troupe::rl_reports_actor");
  cfg.add_message_type<coordinator_actor>("troupe::coordinator_actor");
  cfg.add_message_type<member_hyperparameters>("troupe::member_hyperparameters");
  cfg.add_message_type<std::vector<member_hyperparameters>>(
      "std::vector<troupe::member_hyperparameters>");
  cfg.add_message_type<member_score>("troupe::member_score");
  cfg.add_message_type<std::vector<member_score>>("std::vector<troupe::member_score>");
  cfg.add_message_type<population_event>("troupe::population_event");
  cfg.add_message_type<population_round>("troupe::population_round");
  cfg.add_message_type<population_controller_actor>("troupe::population_controller_actor");
  cfg.add_message_type<std::vector<trajectory_queue_actor>>(
      "std::vector<troupe::trajectory_queue_actor>");
}

}  // namespace troupe
