#include "actors/inference_server.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "actors/failure.hpp"
#include "actors/rl_actor.hpp"
#include "actors/visible_mailbox.hpp"

namespace troupe {

std::vector<inference_reply> infer_batch(inference_compute& c, const policy_head& head,
                                         uint64_t seed, const std::vector<inference_request>& batch,
                                         int64_t version) {
  int64_t rows = 0;
  for (const auto& r : batch) rows += r.observations.dim(0);
  const int64_t O = batch.empty() ? 0 : batch.front().observations.dim(1);
  const int64_t P = head.outputs();
  c.observations.resize(static_cast<std::size_t>(rows * O));
  c.outputs.resize(static_cast<std::size_t>(rows * P));
  c.values.resize(static_cast<std::size_t>(rows));
  float* x = c.observations.data();
  for (const auto& r : batch)
    x = std::copy(r.observations.f32(), r.observations.f32() + r.observations.numel(), x);
  c.net->forward(c.observations.data(), rows, c.outputs.data(), c.values.data());
  const bool box = head.distribution == action_distribution::gaussian;
  std::vector<inference_reply> replies(batch.size());
  const float* out = c.outputs.data();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto& r = batch[i];
    const int64_t M = r.observations.dim(0);
    auto& reply = replies[i];
    reply.policy_version = version;
    reply.outputs = tensor::uninitialized({M, P});
    std::copy(out, out + M * P, reply.outputs.f32());
    out += M * P;
    if (r.outputs_only) continue;
    reply.actions =
        box ? tensor::uninitialized({M, head.actions}) : tensor::uninitialized({M}, dtype::i32);
    auto stream = c.streams.try_emplace(r.actor, 0).first;
    if (r.step == 0) stream->second = splitmix64(actor_sampling_seed(seed, r.actor));
    sample_policy_actions(head, reply.outputs.f32(), M, r.epsilon, stream->second, c.probs,
                          box ? nullptr : reply.actions.data<int32_t>(),
                          box ? reply.actions.f32() : nullptr);
  }
  return replies;
}

namespace {

using self_ptr = inference_server_actor::stateful_pointer<inference_server_state>;

void fail(self_ptr self, const std::string& why) {
  spdlog::error("inference server: {}", why);
  self->quit(caf::make_error(caf::sec::runtime_error, "inference server: " + why));
}

// Why a request does not fit the server's policy, or "".
std::string request_problem(const inference_request& r, int64_t observation_size) {
  const auto& x = r.observations;
  if (x.rank() == 2 && x.dim(0) > 0 && x.dim(1) == observation_size && x.type() == dtype::f32)
    return {};
  return "rl_actor " + std::to_string(r.actor) + ": observations of shape " +
         shape_string(x.shape()) + " " + dtype_name(x.type()) + ", expected [M, " +
         std::to_string(observation_size) + "] f32";
}

// The first requests of the waiting batch, up to max_batch rows (at least one).
std::vector<inference_server_state::waiting_request> take_batch(inference_server_state& st) {
  std::size_t n = 0;
  int64_t rows = 0;
  while (n < st.waiting.size()) {
    const int64_t m = st.waiting[n].request.observations.dim(0);
    if (n > 0 && rows + m > st.cfg.max_batch) break;
    rows += m;
    ++n;
  }
  std::vector<inference_server_state::waiting_request> batch(
      std::make_move_iterator(st.waiting.begin()),
      std::make_move_iterator(st.waiting.begin() + static_cast<std::ptrdiff_t>(n)));
  st.waiting.erase(st.waiting.begin(), st.waiting.begin() + static_cast<std::ptrdiff_t>(n));
  st.waiting_rows -= rows;
  return batch;
}

void maybe_run(self_ptr self);

// The first request of a new batch: its wait starts.
void start_wait(self_ptr self) {
  auto& st = self->state;
  self->delayed_send(self, std::chrono::microseconds(st.cfg.max_wait_us), flush_atom::value,
                     st.batch_number);
}

// One batch on the device, then its answers.
void run(self_ptr self) {
  auto& st = self->state;
  auto batch =
      std::make_shared<std::vector<inference_server_state::waiting_request>>(take_batch(st));
  ++st.batch_number;
  if (st.overdue) ++st.ran.overdue_batches;
  st.overdue = false;
  st.running = true;
  if (!st.waiting.empty()) start_wait(self);
  auto requests = std::make_shared<std::vector<inference_request>>();
  for (auto& w : *batch) requests->push_back(std::move(w.request));
  auto weights = st.weights ? std::make_shared<policy_weights>(std::move(*st.weights)) : nullptr;
  st.weights.reset();
  auto replies = std::make_shared<std::vector<inference_reply>>();
  st.track.set("infer", trace::category::compute, st.ran.batches);
  st.tasks->submit(
      self, "infer",
      [requests, weights, replies, head = st.cfg.head, seed = st.cfg.seed,
       version = st.version](inference_compute& c) {
        if (weights) install_policy_weights(*c.net, *weights);
        *replies = infer_batch(c, head, seed, *requests, version);
      },
      [self, batch, replies, requests] {
        auto& st = self->state;
        for (std::size_t i = 0; i < batch->size(); ++i)
          (*batch)[i].promise.deliver(std::move((*replies)[i]));
        ++st.ran.batches;
        for (const auto& r : *requests) st.ran.rows += r.observations.dim(0);
        st.running = false;
        st.track.set("wait_for_requests", trace::category::wait);
        maybe_run(self);
      });
}

// The waiting batch runs when the device is free, weights are known and it
// is full, every live actor asked, or it waited long enough.
void maybe_run(self_ptr self) {
  auto& st = self->state;
  if (st.running || st.version < 0 || st.waiting.empty()) return;
  const bool everyone = static_cast<int64_t>(st.waiting.size()) >= st.live;
  if (st.overdue || everyone || st.waiting_rows >= st.cfg.max_batch) run(self);
}

// A requester seen for the first time is monitored: once it is down, the
// batches no longer wait for it.
void know_requester(self_ptr self) {
  auto& st = self->state;
  const auto who = self->current_sender();
  if (!who || st.requesters.count(caf::actor_cast<caf::actor_addr>(who)) > 0) return;
  st.requesters.emplace(caf::actor_cast<caf::actor_addr>(who), 0);
  self->monitor(who);
  st.live = std::max(st.live, static_cast<int64_t>(st.requesters.size()));
}

void requester_down(self_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.requesters.erase(dm.source) == 0) return;
  st.live = std::max<int64_t>(1, st.live - 1);
  spdlog::debug("inference server: a requester is down; batches wait for {} actors", st.live);
  maybe_run(self);
}

}  // namespace

inference_server_actor::behavior_type inference_server(self_ptr self, inference_server_config cfg) {
  keep_exception_cause(self, "inference server");
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.live = st.cfg.actors;
  st.track.open("inference_server");
  st.track.set("wait_for_requests", trace::category::wait);
  st.compute = std::make_shared<inference_compute>();
  st.tasks = std::make_unique<device_tasks<inference_compute>>(
      st.cfg.device, st.compute, [self](const std::string& why) { fail(self, why); });
  st.tasks->submit(
      self,
      [c = st.cfg](inference_compute& ic) {
        ic.net = create_policy_value_model(c.model, c.observation_size, c.head, c.seed);
      },
      nullptr);
  self->set_down_handler([self](caf::down_msg& dm) { requester_down(self, dm); });
  return {
      [self](infer_atom, inference_request& r) -> caf::result<inference_reply> {
        auto& st = self->state;
        if (auto why = request_problem(r, st.cfg.observation_size); !why.empty())
          return caf::make_error(caf::sec::invalid_argument, why);
        know_requester(self);
        auto promise = self->make_response_promise<inference_reply>();
        if (st.waiting.empty()) start_wait(self);
        st.waiting_rows += r.observations.dim(0);
        st.waiting.push_back({std::move(r), promise});
        maybe_run(self);
        return promise;
      },
      [self](weights_atom, policy_weights& w) {
        auto& st = self->state;
        if (w.version <= st.version) return;
        st.version = w.version;
        st.weights = std::move(w);
        maybe_run(self);
      },
      [self](stats_atom) { return self->state.ran; },
      [self](flush_atom, int64_t n) {
        auto& st = self->state;
        if (n != st.batch_number) return;
        st.overdue = true;
        maybe_run(self);
      },
      [self](computed_atom, uint64_t ticket) { self->state.tasks->computed(ticket); },
  };
}

inference_server_actor spawn_inference_server(caf::actor_system& sys, inference_server_config cfg) {
  return spawn_visible<inference_server_actor, inference_server_state, inference_server_config>(
      sys, inference_server, std::move(cfg));
}

}  // namespace troupe
