#include "actors/inference_server.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "actors/failure.hpp"
#include "actors/rl_actor.hpp"
#include "actors/visible_mailbox.hpp"

namespace troupe {

namespace {

using self_ptr = inference_server_actor::stateful_pointer<inference_server_state>;

void fail(self_ptr self, const std::string& why) {
  spdlog::error("inference server: {}", why);
  self->quit(caf::make_error(caf::sec::runtime_error, "inference server: " + why));
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
  const bool overdue = st.overdue;
  st.overdue = false;
  st.running = true;
  if (!st.waiting.empty()) start_wait(self);
  auto requests = std::make_shared<std::vector<inference_request>>();
  for (auto& w : *batch) requests->push_back(std::move(w.request));
  auto replies = std::make_shared<std::vector<inference_reply>>();
  st.track.set("infer", trace::category::compute, st.batch_number);
  st.tasks->submit(
      self, "infer",
      [requests, replies, overdue](inference_batcher& b) {
        *replies = b.infer_now(request_pointers(*requests), overdue);
      },
      [self, batch, replies] {
        auto& st = self->state;
        for (std::size_t i = 0; i < batch->size(); ++i)
          (*batch)[i].promise.deliver(std::move((*replies)[i]));
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
  // The actors of this process ask the batcher, never by message.
  const int64_t by_message = std::max<int64_t>(1, st.live - st.cfg.batcher->joined_in_process());
  const bool everyone = static_cast<int64_t>(st.waiting.size()) >= by_message;
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
  st.tasks = std::make_unique<device_tasks<inference_batcher>>(
      st.cfg.device, st.cfg.batcher, [self](const std::string& why) { fail(self, why); });
  // Actors of this process that wait in the batcher learn the server ended.
  self->attach_functor([b = st.cfg.batcher, addr = self->address()](const caf::error& reason) {
    forget_local_batcher(addr);
    b->close("inference server stopped (" + describe(reason) + ")");
  });
  self->set_down_handler([self](caf::down_msg& dm) { requester_down(self, dm); });
  return {
      [self](infer_atom, inference_request& r) -> caf::result<inference_reply> {
        auto& st = self->state;
        if (auto why = inference_request_problem(r, st.cfg.observation_size); !why.empty())
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
        st.cfg.batcher->offer_weights(std::move(w));
        maybe_run(self);
      },
      [self](stats_atom) { return self->state.cfg.batcher->stats(); },
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
  inference_batcher::settings bs;
  bs.head = cfg.head;
  bs.seed = cfg.seed;
  bs.observation_size = cfg.observation_size;
  bs.max_batch = cfg.max_batch;
  bs.max_wait = std::chrono::microseconds(cfg.max_wait_us);
  bs.yield_for = std::chrono::microseconds(cfg.yield_us);
  bs.device = cfg.forward_device;
  bs.model = cfg.model;
  // The policy is built here, before any actor can ask for it.
  cfg.batcher = std::make_shared<inference_batcher>(
      bs, create_policy_value_model(cfg.model, cfg.observation_size, cfg.head, cfg.seed));
  auto batcher = cfg.batcher;
  auto server =
      spawn_visible<inference_server_actor, inference_server_state, inference_server_config>(
          sys, inference_server, std::move(cfg));
  register_local_batcher(caf::actor_cast<caf::actor_addr>(server), std::move(batcher));
  return server;
}

}  // namespace troupe
