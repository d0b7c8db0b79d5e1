#include "actors/rl_actor.hpp"
#include "actors/failure.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "actors/visible_mailbox.hpp"
#include "envs/policy_head.hpp"
#include "kernels/softmax.hpp"
#include "models/dqn.hpp"

namespace troupe {

void init_rl_actor_compute(rl_actor_compute& c, const envs::env_choice& env, int64_t envs,
                           const model_config& model, uint64_t seed, uint64_t model_seed,
                           const std::optional<policy_head>& head, bool with_policy) {
  c.env = envs::make_job_env(env, envs);
  const auto& spec = c.env->spec();
  c.head = head ? *head : envs::policy_head_for(spec, "auto");
  if (with_policy)
    c.net = create_policy_value_model(model, spec.observation_size, c.head, model_seed);
  c.rng = splitmix64(derive_seed(seed, 1));
  const auto M = static_cast<std::size_t>(envs);
  c.obs.assign(M * static_cast<std::size_t>(spec.observation_size), 0.0f);
  c.values.assign(M, 0.0f);
  c.probs.assign(static_cast<std::size_t>(spec.actions), 0.0f);
  c.terminated.assign(M, 0);
  c.truncated.assign(M, 0);
  c.episode_return.assign(M, 0.0);
  c.episode_length.assign(M, 0);
  c.env->reset(seed, c.obs.data());
}

uint64_t actor_sampling_seed(uint64_t job_seed, int64_t index) {
  // As rl_actor seeds its compute (init_rl_actor_compute's stream 1).
  return derive_seed(derive_seed(job_seed, 5000 + static_cast<uint64_t>(index)), 1);
}

namespace {

// A sample of the softmax of one row of logits: p gets the row's unnormalised
// probabilities, and u (uniform in [0, 1)) picks among them.
int32_t sample_action(const float* z, int64_t A, double u, float* p) {
  const double sum = kernels::shifted_exp_row(z, A, p).sum;
  double acc = 0;
  const double target = u * sum;
  for (int64_t j = 0; j + 1 < A; ++j) {
    acc += p[j];
    if (target < acc) return static_cast<int32_t>(j);
  }
  return static_cast<int32_t>(A - 1);
}

}  // namespace

void sample_policy_actions(const policy_head& head, const float* outputs, int64_t rows,
                           double epsilon, splitmix64& rng, std::vector<float>& probs,
                           int32_t* discrete, float* box) {
  if (head.distribution == action_distribution::gaussian) {
    // Unclipped: the environment clips it to its bounds.
    const int64_t D = head.actions;
    for (int64_t m = 0; m < rows; ++m) {
      const float* mu = outputs + m * 2 * D;
      for (int64_t d = 0; d < D; ++d)
        box[m * D + d] =
            static_cast<float>(mu[d] + std::exp(static_cast<double>(mu[D + d])) * rng.normal());
    }
    return;
  }
  const int64_t P = head.outputs();
  if (epsilon >= 0) {  // Ape-X: the outputs are Q-values
    for (int64_t m = 0; m < rows; ++m)
      discrete[m] = epsilon_greedy(outputs + m * P, P, epsilon, rng);
    return;
  }
  probs.resize(static_cast<std::size_t>(P));
  for (int64_t m = 0; m < rows; ++m)
    discrete[m] = sample_action(outputs + m * P, P, rng.uniform(), probs.data());
}

namespace {

// The policy's outputs on x_t and sampled actions: local inference.
void infer_locally(rl_actor_compute& c, unroll& u, int64_t t) {
  const int64_t M = c.env->size();
  const int64_t O = c.env->spec().observation_size;
  const int64_t P = c.head.outputs();
  float* outputs = u.behaviour_logits.f32() + t * M * P;
  c.net->forward(u.observations.f32() + t * M * O, M, outputs, c.values.data());
  const bool box = c.head.distribution == action_distribution::gaussian;
  sample_policy_actions(c.head, outputs, M, c.epsilon, c.rng, c.probs,
                        box ? nullptr : u.actions.data<int32_t>() + t * M,
                        box ? u.actions.f32() + t * M * c.head.actions : nullptr);
}

}  // namespace

unroll begin_unroll(rl_actor_compute& c, int64_t actor, int64_t T) {
  const int64_t M = c.env->size();
  const int64_t O = c.env->spec().observation_size;
  const bool box = c.head.distribution == action_distribution::gaussian;
  unroll u;
  u.actor = actor;
  u.observations = tensor::uninitialized({T + 1, M, O});
  u.actions = box ? tensor::uninitialized({T, M, c.head.actions})
                  : tensor::uninitialized({T, M}, dtype::i32);
  u.rewards = tensor::uninitialized({T, M});
  u.terminated = tensor::uninitialized({T, M}, dtype::i32);
  u.truncated = tensor::uninitialized({T, M}, dtype::i32);
  u.final_observations = tensor({T, M, O});  // rows of episodes that did not end stay 0
  u.behaviour_logits = tensor::uninitialized({T, M, c.head.outputs()});
  std::copy(c.obs.begin(), c.obs.end(), u.observations.f32());
  return u;
}

void step_unroll(rl_actor_compute& c, unroll& u, int64_t t, episode_report& episodes) {
  const int64_t M = c.env->size();
  const int64_t O = c.env->spec().observation_size;
  envs::step_output out;
  out.terminated = c.terminated.data();
  out.truncated = c.truncated.data();
  out.episode_return = c.episode_return.data();
  out.episode_length = c.episode_length.data();
  out.obs = u.observations.f32() + (t + 1) * M * O;
  out.reward = u.rewards.f32() + t * M;
  out.final_obs = u.final_observations.f32() + t * M * O;
  if (c.head.distribution == action_distribution::gaussian)
    c.env->step_box(u.actions.f32() + t * M * c.head.actions, out);
  else
    c.env->step(u.actions.data<int32_t>() + t * M, out);
  int32_t* term = u.terminated.data<int32_t>() + t * M;
  int32_t* trunc = u.truncated.data<int32_t>() + t * M;
  for (int64_t m = 0; m < M; ++m) {
    const auto i = static_cast<std::size_t>(m);
    term[m] = c.terminated[i];
    trunc[m] = c.truncated[i];
    if (term[m] || trunc[m]) {
      episodes.returns.push_back(c.episode_return[i]);
      episodes.lengths.push_back(c.episode_length[i]);
    }
  }
  episodes.env_steps += M;
  // The next observations carry over to the next unroll.
  if (t + 1 == u.steps()) std::copy(out.obs, out.obs + M * O, c.obs.begin());
}

unroll act_unroll(rl_actor_compute& c, int64_t actor, int64_t policy_version, int64_t T,
                  episode_report& episodes) {
  unroll u = begin_unroll(c, actor, T);
  u.policy_version = policy_version;
  episodes.actor = actor;
  for (int64_t t = 0; t < T; ++t) {
    infer_locally(c, u, t);
    step_unroll(c, u, t, episodes);
  }
  return u;
}

void set_initial_priorities(transition_batch& b, const unroll& u, const float* q_next, int64_t A) {
  const int64_t B = b.size();
  const float* q = u.behaviour_logits.f32();  // [T, M, A]: rows as the transitions'
  for (int64_t i = 0; i < B; ++i) {
    const float* qn = q_next + i * A;
    const double y = b.returns.f32()[i] + b.discounts.f32()[i] * *std::max_element(qn, qn + A);
    const double td = y - q[i * A + b.actions.data<int32_t>()[i]];
    // Never 0: a transition with no priority would never be sampled.
    b.priorities.f32()[i] = static_cast<float>(std::abs(td) + 1e-3);
  }
}

transition_batch prioritized_transitions(rl_actor_compute& c, const unroll& u, int64_t n,
                                         double discount) {
  auto b = nstep_transitions(u, n, discount);
  const int64_t B = b.size(), A = c.head.outputs();
  std::vector<float> q_next(static_cast<std::size_t>(B * A)), values(static_cast<std::size_t>(B));
  c.net->forward(b.next_observations.f32(), B, q_next.data(), values.data());
  set_initial_priorities(b, u, q_next.data(), A);
  return b;
}

namespace {

using self_ptr = rl_actor_actor::stateful_pointer<rl_actor_state>;

void fail(self_ptr self, const std::string& why) {
  const auto who = "rl_actor " + std::to_string(self->state.cfg.index);
  spdlog::error("{}: {}", who, why);
  self->quit(caf::make_error(caf::sec::runtime_error, who + ": " + why));
}

}  // namespace

void install_policy_weights(policy_value_model& net, const policy_weights& w) {
  auto& vars = net.variables();
  if (w.values.size() != vars.size())
    throw std::runtime_error("weights of version " + std::to_string(w.version) + " hold " +
                             std::to_string(w.values.size()) + " tensors, the policy " +
                             std::to_string(vars.size()));
  for (std::size_t i = 0; i < vars.size(); ++i) {
    if (w.values[i].shape() != vars[i].value.shape() || w.values[i].type() != dtype::f32)
      throw std::runtime_error("weights of version " + std::to_string(w.version) + ": '" +
                               vars[i].name + "' has shape " + shape_string(w.values[i].shape()) +
                               ", the policy " + shape_string(vars[i].value.shape()));
  }
  for (std::size_t i = 0; i < vars.size(); ++i)
    std::copy(w.values[i].f32(), w.values[i].f32() + w.values[i].numel(), vars[i].value.f32());
}

namespace {

void act(self_ptr self);

// The queue or a shard took the unroll: that answer is the credit to act
// the next one.
void taken(self_ptr self) {
  self->state.phase = rl_actor_phase::ready;
  self->state.track.set("wait_for_weights", trace::category::wait);
  act(self);
}

// Ape-X: the unroll's transitions go to the shards in turn.
void insert(self_ptr self, std::shared_ptr<transition_batch> b) {
  auto& st = self->state;
  const auto& shards = st.cfg.replay;
  const auto& shard = shards[static_cast<std::size_t>(st.unrolls) % shards.size()];
  st.track.set("insert", trace::category::communicate, st.unrolls);
  self->request(shard, st.cfg.request_timeout, insert_atom::value, std::move(*b))
      .then([self](int64_t) { taken(self); },
            [self](caf::error& e) { fail(self, "replay shard: " + describe(e)); });
}

void offer(self_ptr self, std::shared_ptr<unroll> u) {
  auto& st = self->state;
  st.track.set("enqueue", trace::category::communicate, st.unrolls);
  self->request(st.cfg.queue, st.cfg.request_timeout, enqueue_atom::value, std::move(*u))
      .then([self](int64_t) { taken(self); },
            [self](caf::error& e) { fail(self, "trajectory queue: " + describe(e)); });
}

// An unroll is acted: its episodes to the coordinator, the unroll to the
// queue or its transitions to a shard.
void unrolled(self_ptr self, std::shared_ptr<unroll> u, std::shared_ptr<episode_report> report,
              std::shared_ptr<transition_batch> transitions) {
  auto& st = self->state;
  ++st.unrolls;
  if (st.unrolls == st.cfg.fail_after_unrolls)
    return fail(self, "test hook: failing after " + std::to_string(st.unrolls) + " unrolls");
  self->send(st.cfg.coordinator, episodes_atom::value, std::move(*report));
  if (st.cfg.replay.empty()) return offer(self, u);
  insert(self, transitions);
}

// Central inference's epsilon for this actor's requests: Ape-X's, or none
// (-1: actions sampled from the policy head).
double central_epsilon(const rl_actor_config& c) {
  return c.replay.empty() ? -1.0 : c.epsilon;
}

// Step t's request to the server: the observations x_t of the unroll's
// environments, as the actor's request number `step`.
inference_request step_request(const unroll& u, int64_t t, int64_t step, double epsilon) {
  const int64_t M = u.envs(), O = u.observations.dim(2);
  inference_request req;
  req.actor = u.actor;
  req.step = step;
  req.epsilon = epsilon;
  req.observations = tensor::uninitialized({M, O});
  const float* x = u.observations.f32() + t * M * O;
  std::copy(x, x + M * O, req.observations.f32());
  return req;
}

// The server's answer for step t into the unroll, or why it does not fit.
// The unroll's version: the oldest that chose any of its actions.
std::string take_reply(unroll& u, int64_t t, const inference_reply& r) {
  const int64_t A = u.actions.numel() / u.steps();  // action elements per step
  const int64_t P = u.behaviour_logits.numel() / u.steps();
  if (r.actions.numel() != A || r.actions.type() != u.actions.type() || r.outputs.numel() != P ||
      r.outputs.type() != dtype::f32)
    return "a reply of actions " + shape_string(r.actions.shape()) + " and outputs " +
           shape_string(r.outputs.shape()) + " does not fit this actor's environments";
  if (u.actions.type() == dtype::i32)
    std::copy(r.actions.data<int32_t>(), r.actions.data<int32_t>() + A,
              u.actions.data<int32_t>() + t * A);
  else
    std::copy(r.actions.f32(), r.actions.f32() + A, u.actions.f32() + t * A);
  std::copy(r.outputs.f32(), r.outputs.f32() + P, u.behaviour_logits.f32() + t * P);
  u.policy_version = t == 0 ? r.policy_version : std::min(u.policy_version, r.policy_version);
  return {};
}

// Ape-X's request for the bootstrap Q-values of the transitions' next
// observations (outputs only: the sampling stream goes on).
inference_request bootstrap_request(const transition_batch& b, int64_t actor) {
  inference_request req;
  req.actor = actor;
  req.step = -1;  // not a step
  req.observations = b.next_observations;
  req.outputs_only = true;
  return req;
}

// The server's bootstrap Q-values into the transitions' initial priorities
// (as a local actor computes them with its own), or why they do not fit.
std::string take_bootstrap(transition_batch& b, const unroll& u, const inference_reply& r) {
  const int64_t A = u.behaviour_logits.dim(2);
  if (r.outputs.numel() != b.size() * A || r.outputs.type() != dtype::f32)
    return "bootstrap Q-values of shape " + shape_string(r.outputs.shape()) + " for " +
           std::to_string(b.size()) + " transitions";
  set_initial_priorities(b, u, r.outputs.f32(), A);
  return {};
}

// Central inference through the batcher of a server in this process (on
// the actor's device thread): step t's actions and outputs into the unroll.
void infer_in_process(rl_actor_compute& c, inference_batcher& b, unroll& u, int64_t t,
                      double epsilon) {
  if (auto why = take_reply(u, t, b.infer(step_request(u, t, c.inference_requests++, epsilon)));
      !why.empty())
    throw std::runtime_error("inference server: " + why);
}

// Ape-X through the batcher: the unroll's n-step transitions with initial
// priorities from the server's bootstrap Q-values (as central_transitions).
transition_batch transitions_in_process(inference_batcher& b, const unroll& u, int64_t n,
                                        double discount) {
  auto batch = nstep_transitions(u, n, discount);
  if (auto why = take_bootstrap(batch, u, b.infer(bootstrap_request(batch, u.actor))); !why.empty())
    throw std::runtime_error("inference server: " + why);
  return batch;
}

// Central inference with Ape-X: the unroll's n-step transitions, their
// bootstrap Q-values from the server (the newest weights), then their
// initial priorities as a local actor computes them with its own.
void central_transitions(self_ptr self, const std::shared_ptr<unroll>& u,
                         const std::shared_ptr<episode_report>& report) {
  auto& st = self->state;
  auto b = std::make_shared<transition_batch>();
  st.track.set("transitions", trace::category::compute, st.unrolls);
  st.tasks->submit(
      self, "transitions",
      [u, b, n = st.cfg.n_step, gamma = st.cfg.discount](rl_actor_compute&) {
        *b = nstep_transitions(*u, n, gamma);
      },
      [self, u, report, b] {
        auto& st = self->state;
        st.track.set("infer", trace::category::communicate, st.unrolls);
        self->request(st.cfg.inference, st.cfg.request_timeout, infer_atom::value,
                      bootstrap_request(*b, st.cfg.index))
            .then(
                [self, u, report, b](inference_reply& r) {
                  if (auto why = take_bootstrap(*b, *u, r); !why.empty())
                    return fail(self, "inference server: " + why);
                  unrolled(self, u, report, b);
                },
                [self](caf::error& e) { fail(self, "inference server: " + describe(e)); });
      });
}

// Central inference, step t of the unroll `u`: the observations x_t to the
// server, its actions and outputs into the unroll, one step of the
// environments on the device, then step t + 1.
void central_step(self_ptr self, std::shared_ptr<unroll> u, std::shared_ptr<episode_report> report,
                  int64_t t) {
  auto& st = self->state;
  if (t == u->steps()) {
    if (!st.cfg.replay.empty()) return central_transitions(self, u, report);
    return unrolled(self, u, report, nullptr);
  }
  st.track.set("infer", trace::category::communicate, st.unrolls);
  self->request(st.cfg.inference, st.cfg.request_timeout, infer_atom::value,
                step_request(*u, t, st.inference_requests++, central_epsilon(st.cfg)))
      .then(
          [self, u, report, t](inference_reply& r) {
            auto& st = self->state;
            if (auto why = take_reply(*u, t, r); !why.empty())
              return fail(self, "inference server: " + why);
            st.track.set("step", trace::category::compute, st.unrolls);
            st.tasks->submit(
                self, "step",
                [u, report, t](rl_actor_compute& c) { step_unroll(c, *u, t, *report); },
                [self, u, report, t] { central_step(self, u, report, t + 1); });
          },
          [self](caf::error& e) { fail(self, "inference server: " + describe(e)); });
}

// Central inference in this process: a whole unroll in one device task,
// each step's actions from the batcher (its batches wait for this actor
// while it acts).
void act_central_in_process(self_ptr self) {
  auto& st = self->state;
  st.phase = rl_actor_phase::unrolling;
  auto u = std::make_shared<unroll>();
  auto report = std::make_shared<episode_report>();
  auto transitions = std::make_shared<transition_batch>();
  const bool apex = !st.cfg.replay.empty();
  st.track.set("act", trace::category::compute, st.unrolls);
  st.tasks->submit(
      self, "act",
      [b = st.batcher, u, report, transitions, apex, index = st.cfg.index, T = st.cfg.unroll_length,
       epsilon = central_epsilon(st.cfg), n = st.cfg.n_step,
       gamma = st.cfg.discount](rl_actor_compute& c) {
        inference_batcher::acting acting(*b);
        *u = begin_unroll(c, index, T);
        report->actor = index;
        for (int64_t t = 0; t < T; ++t) {
          infer_in_process(c, *b, *u, t, epsilon);
          step_unroll(c, *u, t, *report);
        }
        if (apex) *transitions = transitions_in_process(*b, *u, n, gamma);
      },
      [self, u, report, transitions] { unrolled(self, u, report, transitions); });
}

// Central inference: a new unroll from the current observations.
void act_central(self_ptr self) {
  auto& st = self->state;
  st.phase = rl_actor_phase::unrolling;
  auto u = std::make_shared<unroll>();
  auto report = std::make_shared<episode_report>();
  report->actor = st.cfg.index;
  st.tasks->submit(
      self, "begin_unroll",
      [u, index = st.cfg.index, T = st.cfg.unroll_length](rl_actor_compute& c) {
        *u = begin_unroll(c, index, T);
      },
      [self, u, report] { central_step(self, u, report, 0); });
}

// The next unroll, when ready and some weights are known (or the server
// knows them).
void act(self_ptr self) {
  auto& st = self->state;
  if (st.phase != rl_actor_phase::ready) return;
  if (st.batcher) return act_central_in_process(self);
  if (st.cfg.inference) return act_central(self);
  if (st.acting_version < 0 && !st.pending) return;
  st.phase = rl_actor_phase::unrolling;
  std::shared_ptr<policy_weights> w;
  if (st.pending) {
    w = std::make_shared<policy_weights>(std::move(*st.pending));
    st.pending.reset();
    st.acting_version = w->version;
  }
  auto u = std::make_shared<unroll>();
  auto report = std::make_shared<episode_report>();
  auto transitions = std::make_shared<transition_batch>();
  st.track.set("act", trace::category::compute, st.unrolls);
  st.tasks->submit(
      self, "act",
      [w, u, report, transitions, index = st.cfg.index, version = st.acting_version,
       T = st.cfg.unroll_length, apex = !st.cfg.replay.empty(), n = st.cfg.n_step,
       gamma = st.cfg.discount](rl_actor_compute& c) {
        if (w) install_policy_weights(*c.net, *w);
        *u = act_unroll(c, index, version, T, *report);
        if (apex) *transitions = prioritized_transitions(c, *u, n, gamma);
      },
      [self, u, report, transitions] { unrolled(self, u, report, transitions); });
}

}  // namespace

rl_actor_actor::behavior_type rl_actor(self_ptr self, rl_actor_config cfg) {
  keep_exception_cause(self, "rl_actor " + std::to_string(cfg.index));
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.track.open("rl_actor:" + std::to_string(st.cfg.index));
  st.track.set("wait_for_weights", trace::category::wait);
  st.compute = std::make_shared<rl_actor_compute>();
  if (st.cfg.inference && st.cfg.inference_in_process)
    st.batcher = find_local_batcher(caf::actor_cast<caf::actor_addr>(st.cfg.inference));
  if (st.batcher) st.batcher->join_in_process();
  st.tasks = std::make_unique<device_tasks<rl_actor_compute>>(
      st.cfg.device, st.compute, [self](const std::string& why) { fail(self, why); });
  st.tasks->submit(
      self,
      [c = st.cfg](rl_actor_compute& rc) {
        // With an inference server the actor only steps its environments.
        init_rl_actor_compute(rc, c.env, c.envs, c.model, derive_seed(c.seed, 5000 + c.index),
                              c.seed, c.head, /*with_policy=*/!c.inference);
        if (!c.replay.empty()) rc.epsilon = c.epsilon;
      },
      nullptr);
  return {
      [self](run_atom) {
        auto& st = self->state;
        if (st.phase == rl_actor_phase::built) st.phase = rl_actor_phase::ready;
        act(self);
      },
      [self](weights_atom, policy_weights& w) {
        auto& st = self->state;
        if (w.version <= st.received_version) return;
        st.received_version = w.version;
        st.pending = std::move(w);
        act(self);
      },
      [self](computed_atom, uint64_t ticket) { self->state.tasks->computed(ticket); },
  };
}

rl_actor_actor spawn_rl_actor(caf::actor_system& sys, rl_actor_config cfg) {
  return spawn_visible<rl_actor_actor, rl_actor_state, rl_actor_config>(sys, rl_actor,
                                                                        std::move(cfg));
}

}  // namespace troupe
