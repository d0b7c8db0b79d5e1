// actor_learner: IMPALA-style reinforcement learning (Espeholt et al. 2018).
// rl_actors step environments with a copy of the policy and send unrolls
// through a bounded trajectory queue to the learners, which train with
// V-trace and publish weights back. Several learners are data-parallel: each
// takes its share of every batch and they all-reduce gradients through the
// job's reducers.
//
//   rl_actor --enqueue(unroll)--> trajectory_queue <--dequeue(B/L)-- learner
//            <-----(credit)-----                    ---(unrolls)--->   |
//   rl_actor --episodes--> coordinator <--learned-- learner            | all-reduce
//   rl_actor <--weights--- coordinator <--weights-- learner 0          | (reducers)
//                                      --version--> queue   learner 1..L-1
//
// The coordinator is the job's one coordinator (runtime/coordinator.hpp);
// what it hears goes to this strategy's driver
// (strategies/actor_learner_driver.cpp): environment steps, episodes and
// the mean return are its progress measure, the target return its stop.
// Actors: actors/rl_actor, actors/trajectory_queue, actors/learner;
// messages: messages/rl_messages.hpp.
//
// rl.algorithm "apex_dqn" (Ape-X, Horgan et al. 2018) is a protocol variant
// on the same actors: rl_actors act epsilon-greedily (each its own epsilon)
// and insert prioritized n-step transitions into N replay shards in turn;
// learners sample the shards in turn, train double DQN with a target
// network and send new priorities back; weights are published as above.
//
//   rl_actor --insert(transitions)--> replay_shard <--sample(n)-- learner
//            <------(credit)---------              --priority--> (back)
//
// rl.inference "central" (SEED RL) moves the policy off the actors: an
// inference server beside learner 0 answers each step's observations with
// actions and logits, batched over all actors, under the weights learner 0
// hands it after every update (actors/inference_server.hpp). Unrolls go to
// the queue as above; no weights go to the actors (actors on worker tasks
// send observations across, the weights stay in this process).
//
//   rl_actor --infer(observations)--> inference_server <--weights-- learner 0
//            <--(actions, logits)----
//
// rl.population (population-based training) runs N members of the IMPALA
// setup in one job: a trajectory queue and a learner per member, rl_actor i
// acting for member i mod N, and a population controller that copies the
// best members into the worst and perturbs their hyperparameters
// (strategies/population.cpp, where its protocol is).
#include <spdlog/spdlog.h>

#include "actors/inference_server.hpp"
#include "actors/learner.hpp"
#include "actors/replay_shard.hpp"
#include "actors/rl_actor.hpp"
#include "actors/trajectory_queue.hpp"
#include "envs/env.hpp"
#include "envs/policy_head.hpp"
#include "envs/python_env.hpp"
#include "envs/torso.hpp"
#include "models/dqn.hpp"
#include "strategies/actor_learner_driver.hpp"
#include "strategies/population.hpp"
#include "strategies/strategy.hpp"

namespace troupe {
namespace {

// The policy head the job's environment and rl config take (validate has
// checked that they fit).
policy_head head_of(const rl_config& rl) {
  return envs::policy_head_for(envs::job_env_spec(envs::env_choice_of(rl)), rl.policy_head,
                               rl.initial_log_std);
}

// The network the actors, learners and inference server build: model with
// the torso rl.torso picks for the environment's observations.
model_config model_of(const job_config& c) {
  return envs::rl_model_for(envs::job_env_spec(envs::env_choice_of(c.rl)), c.model, c.rl.torso);
}

// The spec of the job's environment: a built-in one by its registered name,
// a Gymnasium one by starting it once (Python, Gymnasium, the id and the
// spaces are found wanting here, at the job's start), a plugin by loading it.
envs::env_spec validated_env_spec(const rl_config& rl) {
  if (!rl.gymnasium && !rl.plugin) {
    auto names = envs::registered_envs();
    if (std::find(names.begin(), names.end(), rl.env) == names.end())
      throw config_error(
          "rl.env", "expected one of " + json_read::quoted_list(names) +
                        " or a {\"kind\": \"gymnasium\"} or {\"kind\": \"plugin\"} object, got \"" +
                        rl.env + "\"");
  }
  try {
    return envs::job_env_spec(envs::env_choice_of(rl));
  } catch (const envs::env_start_error& e) {
    throw config_error(e.key(), e.what());
  } catch (const std::runtime_error& e) {  // the worker died while starting
    throw config_error("rl.env", e.what());
  }
}

class actor_learner final : public strategy {
 public:
  std::string name() const override { return "actor_learner"; }
  bool trains_classifier() const override { return false; }
  // Learners compute on sim:N / cuda:N (models/device_policy.hpp); the
  // rl_actors step their environments on the host whatever their device.
  bool computes_on_discrete_devices() const override { return true; }
  std::string replica_unit() const override { return "rl_actor"; }
  bool own_job() const override { return true; }

  // Its learners all-reduce through reducer actors (no device all-reduce:
  // their gradients come back to the host).
  std::vector<strategy_key> keys() const override {
    return {strategy_keys::reducer(
        {reducer_algorithm::ring, reducer_algorithm::tree, reducer_algorithm::reduce_to_one})};
  }

  void validate(const job_config& c) const override {
    const auto& rl = c.rl;
    auto policies = model_kinds_of(model_family::policy_value);
    if (std::find(policies.begin(), policies.end(), c.model.kind) == policies.end())
      throw config_error("model.kind",
                         "the actor_learner strategy trains a policy/value network: expected " +
                             json_read::one_of(policies) + ", got \"" + c.model.kind + "\"");
    const auto spec = validated_env_spec(rl);
    try {
      envs::policy_head_for(spec, rl.policy_head);
    } catch (const std::invalid_argument& e) {
      throw config_error("rl.policy_head", e.what());
    }
    validate_torso(c, spec);
    if (rl.batch_unrolls % rl.learners != 0)
      throw config_error("rl.batch_unrolls", "expected a multiple of rl.learners (" +
                                                 std::to_string(rl.learners) + "), got " +
                                                 std::to_string(rl.batch_unrolls));
    const int64_t share = rl.batch_unrolls / rl.learners;
    if (rl.queue_capacity < share)
      throw config_error("rl.queue_capacity",
                         "expected at least the unrolls one learner takes per update "
                         "(rl.batch_unrolls / rl.learners = " +
                             std::to_string(share) + "), got " + std::to_string(rl.queue_capacity));
    if (rl.algorithm == "apex_dqn") validate_apex(c);
    if (rl.population.size > 0) validate_population(rl);
    validate_devices(c, spec);
    const auto& t = c.training;
    if (t.max_steps == 0 && t.max_env_steps == 0 && !t.target_return)
      throw config_error("training",
                         "the actor_learner strategy needs a stop: training.max_steps (updates), "
                         "training.max_env_steps or training.target_return");
    const auto& s = c.optimizer.schedule;
    if (s.kind == "cosine" && s.decay_steps == 0 && t.max_steps == 0)
      throw config_error("optimizer.schedule.decay_steps",
                         "a cosine schedule needs the number of updates: set decay_steps or "
                         "training.max_steps (an actor_learner job has no epochs)");
  }

  // The torso rl.torso picks must take the observations: built once here,
  // so that a model.layers of one's own that does not fit is named at the
  // start (nature_cnn_layers names a shape that is no image itself).
  static void validate_torso(const job_config& c, const envs::env_spec& spec) {
    const auto model = envs::rl_model_for(spec, c.model, c.rl.torso);
    if (model.kind != "policy_value_layers") return;
    try {
      create_policy_value_model(model, spec.observation_size,
                                envs::policy_head_for(spec, c.rl.policy_head), c.seed);
    } catch (const config_error& e) {
      throw config_error(
          e.path(), std::string(e.what()).substr(e.path().size() + 2) + " (" + spec.name +
                        "'s observations: " + std::to_string(spec.observation_size) + " values)");
    }
  }

  // Learners, or a server's forward, on a discrete device run the MLP
  // policy's layers (models/device_policy.hpp).
  static void validate_devices(const job_config& c, const envs::env_spec& spec) {
    const auto kind = envs::rl_model_for(spec, c.model, c.rl.torso).kind;
    for (std::size_t i = 0; i < c.devices.size(); ++i)
      check_runs_on("devices[" + std::to_string(i) + "]", "a learner", c.devices[i], kind);
    const auto& d = c.rl.central.device;
    if (d.empty()) return;
    if (c.rl.inference != "central")
      throw config_error("rl.central.device", "applies with rl.inference \"central\" only, got \"" +
                                                  c.rl.inference + "\"");
    check_runs_on("rl.central.device", "an inference server", d, kind);
  }

  static void check_runs_on(const std::string& path, const std::string& who,
                            const std::string& device, const std::string& kind) {
    if (!device.starts_with("cpu:") && kind != "policy_value_mlp")
      throw config_error(path, who + " on " + device +
                                   " runs model.kind \"policy_value_mlp\", got \"" + kind + "\"");
  }

  // Ape-X reads the policy's outputs as Q-values: discrete actions only.
  static void validate_apex(const job_config& c) {
    const auto& rl = c.rl;
    if (head_of(rl).distribution != action_distribution::softmax)
      throw config_error("rl.algorithm",
                         "\"apex_dqn\" needs discrete actions (Q-values per action); " + rl.env +
                             " with rl.policy_head \"" + rl.policy_head + "\" has continuous ones");
    if (rl.replay.min_size > rl.replay.capacity)
      throw config_error("rl.replay.min_size", "expected at most rl.replay.capacity (" +
                                                   std::to_string(rl.replay.capacity) + "), got " +
                                                   std::to_string(rl.replay.min_size));
  }

  // A population is made of IMPALA learner groups of rl.learners each (an
  // exploit lands on all of a member's learners after the same update),
  // each with actors.
  static void validate_population(const rl_config& rl) {
    if (rl.algorithm != "impala")
      throw config_error("rl.population",
                         "population-based training supports rl.algorithm "
                         "\"impala\" only, got \"" +
                             rl.algorithm + "\"");
    if (rl.inference != "local")
      throw config_error("rl.population",
                         "population-based training supports rl.inference "
                         "\"local\" only, got \"" +
                             rl.inference + "\"");
    if (rl.actors < rl.population.size)
      throw config_error("rl.actors", "expected at least one per member of rl.population (size " +
                                          std::to_string(rl.population.size) + "), got " +
                                          std::to_string(rl.actors));
  }

  void check_cluster_jobs(const job_config&, int64_t, int64_t ps, bool) const override {
    if (ps > 0)
      throw config_error("cluster.tasks.ps",
                         "the actor_learner strategy has no variable shards; expected no ps "
                         "tasks, got " +
                             std::to_string(ps));
  }
  bool survives_lost_workers() const override { return true; }

  int64_t replica_count(const job_config& c) const override { return c.rl.actors; }
  std::string replica_count_key() const override { return "rl.actors"; }

  std::unique_ptr<job_hub> spawn_hub(caf::actor_system& sys, std::shared_ptr<const job_plan> plan,
                                     const coordinator_actor& coordinator) const override {
    return std::make_unique<learner_hub>(sys, std::move(plan), coordinator);
  }

  // The rl_actors of one process, wired to the chief's queue and coordinator.
  worker_parts spawn_own_workers(caf::actor_system& sys, std::shared_ptr<const job_plan> plan,
                                 const worker_spec& spec, const caf::message& hub) const override {
    if (!hub.match_elements<std::vector<trajectory_queue_actor>, rl_reports_actor,
                            std::vector<replay_shard_actor>, inference_server_actor>())
      throw job_error(
          "actor_learner: the build order carries no trajectory queue, coordinator, replay "
          "shards and inference server");
    const auto& c = plan->config;
    worker_parts out;
    out.indices = spec.indices;
    for (std::size_t k = 0; k < spec.indices.size(); ++k) {
      rl_actor_config ac;
      ac.index = spec.indices[k];
      ac.device = out.devices.get(spec.devices[k]);
      ac.env = envs::env_choice_of(c.rl);
      ac.envs = c.rl.envs_per_actor;
      ac.unroll_length = c.rl.unroll_length;
      ac.model = model_of(c);
      ac.head = head_of(c.rl);
      ac.seed = c.seed;
      // With a population, actor i acts for member i mod N.
      const auto& queues = hub.get_as<std::vector<trajectory_queue_actor>>(0);
      if (queues.empty()) throw job_error("actor_learner: the build order carries no queue");
      ac.queue = queues[static_cast<std::size_t>(ac.index) % queues.size()];
      ac.coordinator = hub.get_as<rl_reports_actor>(1);
      ac.request_timeout = spec.request_timeout;
      ac.fail_after_unrolls = faults_or_none(plan->options.faults).fail_replica.at_for(ac.index);
      ac.replay = hub.get_as<std::vector<replay_shard_actor>>(2);
      const auto& rp = c.rl.replay;
      ac.epsilon = apex_epsilon(ac.index, c.rl.actors, rp.epsilon, rp.epsilon_alpha);
      ac.n_step = rp.n_step;
      ac.discount = c.rl.discount;
      ac.inference = hub.get_as<inference_server_actor>(3);
      out.others.push_back(caf::actor_cast<caf::actor>(spawn_rl_actor(sys, ac)));
    }
    return out;
  }

 private:
  // The chief's side: the trajectory queue and the learners (with their
  // reducers), reporting to the job's coordinator; with rl.population, a
  // queue and a learner per member and the population controller.
  class learner_hub final : public job_hub {
   public:
    learner_hub(caf::actor_system& sys, std::shared_ptr<const job_plan> plan,
                const coordinator_actor& coordinator)
        : plan_(std::move(plan)), coordinator_(coordinator) {
      const auto& c = plan_->config;
      const auto& rl = c.rl;
      const auto spec = envs::job_env_spec(envs::env_choice_of(rl));
      const int64_t members = std::max<int64_t>(rl.population.size, 1);
      if (rl.population.size > 0)
        parts_.hyperparameters = initial_hyperparameters(rl.population, c.optimizer.learning_rate,
                                                         rl.entropy_cost, c.seed);
      for (int64_t m = 0; m < members; ++m)
        parts_.queues.push_back(spawn_trajectory_queue(
            sys, {rl.queue_capacity,
                  rl.max_policy_lag,
                  {rl.unroll_length, rl.envs_per_actor, spec.observation_size, spec.actions,
                   spec.action_dims()}}));
      if (rl.algorithm == "apex_dqn") spawn_shards(sys, spec.observation_size, spec.actions);
      if (rl.inference == "central") spawn_server(sys, spec.observation_size);
      // Each member's learners all-reduce among themselves only.
      if (rl.learners > 1)
        for (int64_t m = 0; m < members; ++m)
          reducers_.push_back(
              spawn_reducer_group(sys, static_cast<int>(rl.learners), reducer_config_of(c)));
      for (int64_t m = 0; m < members; ++m) {
        parts_.members.emplace_back();
        for (int64_t l = 0; l < rl.learners; ++l)
          parts_.members.back().push_back(spawn_learner(sys, learner_config_of(m, l, spec)));
      }
      if (rl.population.size > 0) {
        population_controller_config pc;
        pc.population = rl.population;
        pc.seed = c.seed;
        pc.members = parts_.members;
        pc.hyperparameters = parts_.hyperparameters;
        parts_.controller = spawn_population_controller(sys, std::move(pc));
      }
    }

    caf::message handles() const override {
      return caf::make_message(parts_.queues, rl_reports_actor{coordinator_}, shards_,
                               parts_.server);
    }

    std::vector<std::pair<std::string, caf::actor>> named() const override {
      std::vector<std::pair<std::string, caf::actor>> out;
      const bool population = parts_.controller != nullptr;
      for (std::size_t m = 0; m < parts_.members.size(); ++m) {
        const auto member = population ? "member " + std::to_string(m) + " " : std::string();
        for (std::size_t l = 0; l < parts_.members[m].size(); ++l)
          out.emplace_back(member + "learner " + std::to_string(l),
                           caf::actor_cast<caf::actor>(parts_.members[m][l]));
        out.emplace_back(member + "trajectory queue",
                         caf::actor_cast<caf::actor>(parts_.queues[m]));
      }
      for (std::size_t i = 0; i < shards_.size(); ++i)
        out.emplace_back("replay shard " + std::to_string(i),
                         caf::actor_cast<caf::actor>(shards_[i]));
      if (parts_.server)
        out.emplace_back("inference server", caf::actor_cast<caf::actor>(parts_.server));
      if (population)
        out.emplace_back("population controller", caf::actor_cast<caf::actor>(parts_.controller));
      return out;
    }

    std::unique_ptr<job_driver> make_driver(
        std::vector<std::pair<int64_t, caf::actor>> workers) override {
      std::vector<rl_actor_actor> actors(static_cast<std::size_t>(plan_->config.rl.actors));
      for (const auto& [index, a] : workers)
        actors.at(static_cast<std::size_t>(index)) = caf::actor_cast<rl_actor_actor>(a);
      return make_actor_learner_driver(*plan_, parts_, std::move(actors));
    }

    // Everything here lives in the chief's process: exits without a sender
    // never cross to another (whose guard would drop them).
    void stop() override {
      for (auto& group : parts_.members)
        for (auto& l : group) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
      for (auto& group : reducers_)
        for (auto& r : group) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
      for (auto& q : parts_.queues) caf::anon_send_exit(q, caf::exit_reason::user_shutdown);
      for (auto& s : shards_) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
      if (parts_.server) caf::anon_send_exit(parts_.server, caf::exit_reason::user_shutdown);
      if (parts_.controller)
        caf::anon_send_exit(parts_.controller, caf::exit_reason::user_shutdown);
    }

   private:
    // Learner l of member m (member 0 outside a population); a member's
    // learner starts from weights of its own (seeded by its index) and trains
    // with the member's hyperparameters.
    learner_config learner_config_of(int64_t m, int64_t l, const envs::env_spec& spec) {
      const auto& c = plan_->config;
      const auto& rl = c.rl;
      const bool population = rl.population.size > 0;
      learner_config lc;
      lc.index = l;
      lc.learners = rl.learners;
      lc.member = population ? m : -1;
      lc.device =
          devices_.get(c.devices[static_cast<std::size_t>(m * rl.learners + l) % c.devices.size()]);
      lc.model = model_of(c);
      lc.observation_size = spec.observation_size;
      lc.actions = spec.actions;
      lc.head = head_of(rl);
      lc.optimizer = c.optimizer;
      lc.total_updates = c.training.max_steps;
      // A population's updates are counted over its members: the
      // coordinator stops the job, not each learner.
      lc.max_updates = population ? 0 : c.training.max_steps;
      lc.seed = population ? derive_seed(c.seed, static_cast<uint64_t>(m)) : c.seed;
      lc.impala = {rl.discount,     rl.reward_scale,        rl.rho_bar, rl.c_bar, rl.baseline_cost,
                   rl.entropy_cost, rl.normalize_advantages};
      if (population) {
        const auto& hp = parts_.hyperparameters[static_cast<std::size_t>(m)];
        lc.optimizer.learning_rate = hp.learning_rate;
        lc.impala.entropy_cost = hp.entropy_cost;
      }
      lc.grad_clip = rl.grad_clip;
      lc.batch_unrolls = rl.batch_unrolls / rl.learners;
      lc.global_samples = rl.batch_unrolls * rl.unroll_length * rl.envs_per_actor;
      lc.weights_every = rl.weights_every;
      lc.queue = parts_.queues[static_cast<std::size_t>(m)];
      if (!reducers_.empty())
        lc.reducer = reducers_[static_cast<std::size_t>(m)][static_cast<std::size_t>(l)];
      lc.coordinator = coordinator_;
      if (l == 0) lc.inference = parts_.server;
      lc.fail_at_update = faults_or_none(plan_->options.faults).fail_learner.at_for(l);
      lc.replay = shards_;
      lc.replay_batch = rl.replay.batch_size;
      lc.target_every = rl.replay.target_every;
      if (!shards_.empty()) lc.global_samples = rl.replay.batch_size * rl.learners;
      return lc;
    }

    // Central inference: the server on a device thread of its own, so that
    // its batches never queue behind a learner's update.
    void spawn_server(caf::actor_system& sys, int64_t observation_size) {
      const auto& c = plan_->config;
      inference_server_config ic;
      ic.device = devices_.get("inference_server");
      ic.model = model_of(c);
      ic.observation_size = observation_size;
      ic.head = head_of(c.rl);
      ic.seed = c.seed;
      ic.actors = c.rl.actors;
      ic.max_batch = c.rl.central.max_batch;
      ic.max_wait_us = c.rl.central.max_wait_us;
      ic.yield_us = c.rl.central.yield_us;
      if (!c.rl.central.device.empty()) {
        const auto d = parse_device(c.rl.central.device);
        try {
          check_device_available(d);
        } catch (const device_error& e) {
          throw config_error("rl.central.device", e.what());
        }
        if (d.discrete()) ic.forward_device = c.rl.central.device;
      }
      parts_.server = spawn_inference_server(sys, ic);
    }

    void spawn_shards(caf::actor_system& sys, int64_t observation_size, int64_t actions) {
      const auto& rp = plan_->config.rl.replay;
      for (int64_t i = 0; i < rp.shards; ++i) {
        replay_shard_config sc;
        sc.index = i;
        sc.capacity = rp.capacity;
        sc.alpha = rp.alpha;
        sc.beta = rp.beta;
        sc.min_size = rp.min_size;
        sc.samples_per_insert = rp.samples_per_insert;
        sc.observation_size = observation_size;
        sc.actions = actions;
        sc.seed = plan_->config.seed;
        shards_.push_back(spawn_replay_shard(sys, sc));
      }
    }

    std::shared_ptr<const job_plan> plan_;
    coordinator_actor coordinator_;
    device_pool devices_;
    actor_learner_parts parts_;                         // the queues, learners, server, controller
    std::vector<replay_shard_actor> shards_;            // Ape-X only
    std::vector<std::vector<reducer_actor>> reducers_;  // each member's, with rl.learners > 1
  };
};

const strategy_registration registered{std::make_shared<actor_learner>()};

}  // namespace
}  // namespace troupe
