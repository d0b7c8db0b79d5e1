#pragma once
// What a strategy (strategies/) may use of the roles: a replica's device and
// step bookkeeping (replica_host), the coordinator's booking, metrics and
// failure (coordinator_host), and fan-in over several actors
// (actors/fan_in.hpp). The roles implement these; a strategy never sees their
// state.
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/fan_in.hpp"
#include "actors/job_plan.hpp"
#include "devices/device_communicator.hpp"
#include "devices/device_context.hpp"
#include "kernels/optimizer.hpp"
#include "messages/protocols.hpp"
#include "models/model.hpp"

namespace troupe {

// A replica's model, optimizer and gradient buffers: touched only by tasks on
// its device thread (one thread, tasks in order).
//
// On a discrete device (sim:N, cuda:N) the variables, gradients and optimizer
// slots live in the device's memory, and net->variables(), grads and the
// optimizer's slot_tensors() are host staging copies. A strategy moves them
// across only where its protocol needs the host (a push, a pull, a CAF
// collective, a snapshot) with the *_to_host / *_to_device calls, which do
// nothing on cpu:N, where host and device memory are the same.
struct compute_state {
  std::unique_ptr<model> net;
  std::unique_ptr<kernels::optimizer> opt;
  std::vector<named_tensor> grads;
  std::shared_ptr<device_context> dev;  // the device's context
  // Discrete devices: device_slots[k][i] is slot k of variable i.
  std::vector<std::vector<device_buffer>> device_slots;
  // This replica's device collectives (mirrored, reducer "nccl"); declared
  // after dev, so it goes first: a communicator uses the context's stream.
  std::unique_ptr<device_communicator> collectives;

  bool discrete() const { return net && net->device_resident(); }
  void variables_to_host() { net->variables_to_host(); }
  void variables_to_device() { net->variables_to_device(); }
  void gradients_to_host() { net->gradients_to_host(grads); }
  void gradients_to_device() { net->gradients_to_device(grads); }
  void slots_to_host();
  void slots_to_device();
  // After opt->init(): the slots' device memory on a discrete device.
  void place_optimizer();
  // One optimizer update where the variables live (opt->apply on cpu:N).
  void apply_update();
};

using step_promise = caf::typed_response_promise<step_stats>;

// Gradients of a step's micro-batches into cs.grads (accumulated), scaled so
// that they are the mean over the global batch, or over this replica's own
// batch with local_mean. Throws at `fail_at_step` (a test hook). on_ready,
// when given, hears of each range of variables whose gradients are final
// during the last micro-batch's backward (model::set_gradients_ready).
step_stats compute_gradients(compute_state& cs, const batch& b, int64_t step, int64_t fail_at_step,
                             bool local_mean, model::gradients_ready_fn on_ready = {});
// The model's variable buffers (shared, not copied).
std::vector<tensor> variable_buffers(compute_state& cs);

class replica_host {
 public:
  virtual ~replica_host() = default;
  // For requests to reducers and shards; continuations run on the replica.
  virtual replica_actor::pointer self() = 0;
  virtual int64_t index() const = 0;
  virtual caf::duration request_timeout() const = 0;
  virtual int64_t fail_at_step() const = 0;  // test hook for compute_gradients
  // The gradient buffers, shared with the device's compute_state (a reducer
  // works on them in place).
  virtual const std::vector<tensor>& gradient_buffers() const = 0;
  // Runs `work` on the device thread, then `then` on the actor. An exception
  // thrown by work ends the replica with its message. `span` names the work
  // in a timeline trace (a string literal: "forward_backward").
  virtual void submit(const char* span, std::function<void(compute_state&)> work,
                      std::function<void()> then) = 0;
  void submit(std::function<void(compute_state&)> work, std::function<void()> then) {
    submit("device_task", std::move(work), std::move(then));
  }
  // Timeline trace: from communicating(what) to communicated() the replica
  // waits for a collective or a shard ("all_reduce", "pull"); its track shows
  // it as communication.
  virtual void communicating(const char* what) = 0;
  virtual void communicated() = 0;
  // The step's figures count toward the sync-on-read training metrics.
  virtual void count(const step_stats& s) = 0;
  // While busy the replica starts no step (e.g. its buffers are in a
  // collective); resume() clears it and starts the next waiting step.
  virtual void set_busy(bool busy) = 0;
  virtual void resume() = 0;
  // Ends the replica with this error; the coordinator reports it.
  virtual void fail(const caf::error& e) = 0;

  // The step held the replica until now: its figures go to the caller and
  // the next waiting step starts.
  void step_finished(step_promise& rp, const step_stats& s) {
    rp.deliver(s);
    resume();
  }

  template <class R>
  void on_device(const char* span, std::function<R(compute_state&)> work,
                 std::function<void(R&)> then) {
    auto out = std::make_shared<R>();
    submit(
        span, [out, work = std::move(work)](compute_state& cs) { *out = work(cs); },
        [out, then = std::move(then)] { then(*out); });
  }
  template <class R>
  void on_device(std::function<R(compute_state&)> work, std::function<void(R&)> then) {
    on_device<R>("device_task", std::move(work), std::move(then));
  }
  // Error handler for requests that end the replica on any error.
  auto failer() {
    return [this](caf::error& e) { fail(e); };
  }
};

class coordinator_host {
 public:
  virtual ~coordinator_host() = default;
  virtual coordinator_actor::pointer self() = 0;
  virtual const job_plan& plan() const = 0;
  // Every replica by index (a rejoining worker's new handle replaces its old).
  virtual std::vector<replica_actor>& replicas() = 0;
  virtual const std::vector<replica_actor>& replicas() const = 0;
  virtual const shard_set& shards() const = 0;
  // Updates issued to replicas, finished, and the next boundary (epoch end,
  // checkpoint, check): no update past it is issued until its work is done.
  virtual int64_t& issued() = 0;
  virtual int64_t completed() const = 0;
  virtual int64_t boundary() const = 0;
  virtual bool finished() const = 0;
  // An update finished (all replicas' parts of a lockstep step, or one
  // worker's push): booked, reported, then the next steps or the boundary.
  virtual void step_done(const step_stats& s) = 0;
  // Steps in flight were given up (a lost worker): the boundary's work runs
  // if nothing else is in flight, else the driver issues more.
  virtual void steps_given_up() = 0;
  virtual void write_metrics(const nlohmann::json& line) = 0;
  // Ends the job with this reason (once; later calls do nothing).
  virtual void fail(const std::string& why) = 0;
  // The replicas that can still answer (the driver's view).
  virtual std::vector<replica_actor> live_replicas() const = 0;
  // Figures the strategy adds to the job's summary (e.g. staleness).
  virtual nlohmann::json& summary_extras() = 0;

  caf::duration request_timeout() const { return plan().request_timeout; }
  // Error handler for a request to a monitored actor: when the actor died,
  // its down message names it, so "receiver down" is left to that.
  // "checkpoint <dir>", the checkpoint this job resumes from, for messages.
  std::string resumed_checkpoint() const {
    const auto& from = plan().resume_from;
    return "checkpoint " + (from && !from->dir.empty() ? from->dir : std::string("(in memory)"));
  }
  auto failed(std::string what) {
    return [this, what = std::move(what)](caf::error& e) {
      if (e == caf::sec::request_receiver_down) return;
      fail(what + ": " + describe(e));
    };
  }
};

// Asks every replica for its state at once (a snapshot each) and hands all
// states, by replica index, to k.
void collect_replica_states(coordinator_host& h, std::function<void(std::vector<model_state>&)> k);

}  // namespace troupe
