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
#include "actors/reducer.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "actors/variable_shard.hpp"
#include "collectives/process_group.hpp"
#include "devices/device_context.hpp"
#include "kernels/optimizer.hpp"
#include "messages/coordinator_messages.hpp"
#include "messages/protocols.hpp"
#include "models/model.hpp"
#include "models/resident_steps.hpp"

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
  // This replica's collective group (mirrored; collectives/process_group.hpp); declared
  // after dev, so it goes first: a communicator uses the context's stream.
  std::shared_ptr<process_group> collectives;
  // The group that synchronised batch norm all-reduces its statistics over
  // (replica_config::statistics_group), or null.
  std::unique_ptr<process_group> statistics;
  // The training set on the device and the steps that run on it
  // (data.placement), or null; declared last, so it goes first.
  std::unique_ptr<resident_steps> resident;
  // ZeRO-1's all-gather of the variables, left in flight past the step that
  // issued it so that it overlaps the way to the next step (the step's
  // answer, the next request): whatever reads or writes the variables next
  // completes it first (settle_variables(), which throws the collective's
  // error). Every task a replica_host submits settles before its work; a
  // step that issues it settles at its own start too (an execution runs
  // several steps in one task).
  process_group* variables_in_flight = nullptr;
  void settle_variables();

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

// Where one step's figures go: the coordinator's request for that step, or
// the step's place in an execution of several (training.steps_per_execution)
// that the replica runs one step at a time. Delivered once.
class step_promise {
 public:
  step_promise() = default;
  explicit step_promise(std::function<void(const step_stats&)> to) : to_(std::move(to)) {}
  void deliver(const step_stats& s) const { to_(s); }

 private:
  std::function<void(const step_stats&)> to_;
};

// Where an execution's figures go, one per step in order. Delivered once.
using execution_promise = std::function<void(std::vector<step_stats>&)>;

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

// One step of a strategy whose step is device work alone (one_device;
// mirrored on device collectives): step `step` on batch `b`, on the device
// thread, returning the step's figures.
using device_step_fn = std::function<step_stats(compute_state&, const batch&, int64_t step)>;

// Such a step's executions: steps [first, first + bs.size()) in one device
// task named `span` (a string literal) in a timeline trace; then, on the
// actor, each step's figures (with its batch's epoch) counted toward the
// training metrics and delivered in order. run_on_device(h, span, step, b,
// ...) is the execution of one step.
void run_on_device(replica_host& h, const char* span, int64_t first, std::vector<batch> bs,
                   device_step_fn one, execution_promise rp);
// An execution's device work as a whole: the figures of steps [first,
// first + bs.size()).
using device_execution_fn = std::function<std::vector<step_stats>(
    compute_state&, const std::vector<batch>&, int64_t first)>;
void run_execution_on_device(replica_host& h, const char* span, int64_t first,
                             std::vector<batch> bs, device_execution_fn all, execution_promise rp);
// The execution on the replica's device-resident data set (compute_state::
// resident, models/resident_steps.hpp) when it has one and each batch is one
// micro-batch (and no step is fail_at_step, the test hook); else `one`, step
// after step. `one` must be what a resident step does: gradients of the
// batch and the optimizer's update.
device_execution_fn resident_or_each(device_step_fn one, int64_t fail_at_step);
void run_on_device(replica_host& h, const char* span, int64_t step, batch b, device_step_fn one,
                   step_promise rp);

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
  // Seconds since the job started (after a restore).
  virtual double elapsed_seconds() const = 0;

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

// The replica side of a strategy: one object per replica, owned by the
// replica actor, called on the actor's thread.
class replica_step {
 public:
  virtual ~replica_step() = default;
  // On the device thread, once the model, optimizer and gradients exist.
  virtual void init(compute_state&) {}
  // Runs training step `step` on batch `b` and delivers `rp` with its
  // figures. The replica starts no other step while it is busy (set_busy).
  virtual void run(replica_host& h, int64_t step, batch b, step_promise rp) = 0;
  // An execution (training.steps_per_execution): steps [first, first +
  // bs.size()) on batches bs, as one piece of device work where the step is
  // device work alone, so that the hand-overs between actors and device
  // (train, computed, the reply) happen once per execution, not per step.
  // A step that does not run executions (false) is given them one step at a
  // time through run().
  virtual bool runs_executions() const { return false; }
  virtual void run_steps(replica_host& /*h*/, int64_t /*first*/, std::vector<batch> /*bs*/,
                         execution_promise /*rp*/) {}
  // The variables an evaluation reads: calls k with a device task that
  // installs them (null: the replica's own variables).
  virtual void eval_variables(replica_host&,
                              std::function<void(std::function<void(compute_state&)>)> k) {
    k(nullptr);
  }
  // Before a snapshot of the replica's state (e.g. gather sharded slots).
  virtual void before_snapshot(replica_host&, std::function<void()> k) { k(); }
};

// The coordinator side of a strategy (design note "The one coordinator"):
// what work is issued when, the strategy's progress measure and its stop.
// The coordinator owns the rest: metrics lines, checkpoints, failure, the
// summary. A driver with replicas issues steps (pump) and the coordinator
// counts them; a driver of a job of its own (actor_learner) hears its
// actors' reports and books each update with coordinator_host::step_done.
class job_driver {
 public:
  virtual ~job_driver() = default;
  // Once, before the first pump (after a restore).
  virtual void start(coordinator_host&) {}
  // Issues steps up to the boundary as the protocol allows.
  virtual void pump(coordinator_host& h) = 0;
  // Replica i is gone. True: the driver dropped it and the job goes on;
  // false: the job ends naming it.
  virtual bool replica_lost(coordinator_host&, std::size_t /*i*/, const std::string& /*cause*/) {
    return false;
  }
  // Another watched actor is gone (a strategy's own worker). True: the
  // driver dropped it and the job goes on; false: the job ends naming it.
  virtual bool actor_lost(coordinator_host&, const caf::actor_addr&, const std::string& /*cause*/) {
    return false;
  }
  // Worker i is back with a new handle (a replica_actor, or the strategy's
  // own worker); ignored unless it was lost.
  virtual void rejoin(coordinator_host&, std::size_t /*i*/, caf::actor /*a*/) {}
  // The replicas that can still answer.
  virtual std::vector<replica_actor> live(const coordinator_host& h) const = 0;

  // --- the progress measure and the stop ---
  // What one update is called in progress lines ("step"; actor_learner: "update").
  virtual std::string unit() const { return "step"; }
  // The "type" of the metrics line written every logging.every_steps updates.
  virtual std::string progress_line_type() const { return "step"; }
  // Adds the strategy's figures to that line and to the progress report
  // (e.g. environment steps and the mean return).
  virtual void progress(coordinator_host&, nlohmann::json& /*line*/, progress_info& /*pi*/) {}
  // Non-empty: the job stops now, for this reason (asked after every update
  // and every report). The default stop is training's end (total_steps).
  virtual std::string stop_reason(const coordinator_host&) const { return {}; }
  // Before the job's last boundary: stops the strategy's own actors (every
  // learner after the same update) and calls k with the updates done then
  // (-1: as counted).
  virtual void halt(coordinator_host&, std::function<void(int64_t)> k) { k(-1); }
  // The summary's strategy figures; and what a checkpoint's meta carries
  // besides the variables, to resume the progress measure.
  virtual void summarize(nlohmann::json& /*summary*/) const {}
  virtual nlohmann::json checkpoint_extra() const { return nullptr; }
  // A driver whose own actors hold the job's state (not replicas) saves and
  // restores it itself: true when it took the call (and calls k when done).
  virtual bool snapshot(coordinator_host&, std::function<void(model_state&)>& /*k*/) {
    return false;
  }
  virtual bool restore(coordinator_host&, std::function<void()>& /*k*/) { return false; }
  // The update a checkpoint of `ms` is filed under (default: `completed`).
  virtual int64_t checkpoint_step(const model_state& /*ms*/, int64_t completed) const {
    return completed;
  }

  // --- reports of a strategy's own actors (messages/rl_messages.hpp) ---
  virtual void on_episodes(coordinator_host&, episode_report&) {}
  virtual void on_learned(coordinator_host&, learner_report&) {}
  virtual void on_weights(coordinator_host&, policy_weights&) {}
};

// What a replica's step is wired to.
struct replica_wiring {
  int64_t index = 0;
  int64_t replicas = 1;                      // in the whole job
  int64_t local_index = 0;                   // among this process's replicas
  reducer_actor reducer;                     // from make_reducers, or null
  std::vector<variable_shard_actor> shards;  // every shard by index (shard strategies)
  placement place;
  bool across_processes = false;  // the reducer spans a ring of processes
  // strategy.reducer.algorithm "device": the collectives run on the devices
  // (collectives/process_group.hpp) instead of through a reducer actor.
  std::shared_ptr<group_rendezvous> device_group;
  // With device collectives across processes: the process's ring node, given
  // to its first replica only (it takes the process's sum around the ring).
  ring_node_actor ring;
  // The device group spans every replica of the job (NCCL across
  // processes): ranks are global replica indices, no ring is involved.
  bool device_group_global = false;
  // With device collectives across processes: the process's direct links to
  // the other processes' first replicas (given with `ring`, to the first
  // replica only); when set, the process's sum goes over them, on the device
  // thread, instead of through the ring node.
  std::shared_ptr<process_group> process_links;
  int64_t local_replicas = 1;  // this process's replicas
  int64_t processes = 1;       // processes with replicas (the ring's length)
  int64_t process_rank = 0;    // this process's place in that ring
  // A collective through the actors whose reply has not come by then fails.
  caf::duration request_timeout = caf::infinite;
  // strategy.reducer.bucket_bytes: how many bytes of issued collectives the
  // reducer actors get in one request.
  int64_t bucket_bytes = int64_t{4} << 20;
};

// What make_reducers builds on.
struct reducer_wiring {
  int local_replicas = 0;  // replicas in this process
  // Across processes (reduces_across_processes() with replicas in more than
  // one process): this process's ring node and the ring of tasks; else empty.
  ring_node_actor ring;
  std::vector<std::string> ring_tasks;
  std::string device_group_id;  // the job's NCCL group id (see node_build), or empty
};

struct reducer_parts {
  std::vector<reducer_actor> per_replica;          // one per local replica, or empty
  std::shared_ptr<group_rendezvous> device_group;  // or this, shared by the replicas
  bool device_group_global = false;                // see replica_wiring
};

// Where a replica's input pipeline starts and what it reads.
struct input_plan {
  int64_t global_batch = 0;  // examples per micro-batch over all replicas
  int64_t start_epoch = 0;
  int64_t start_index = 0;
};

}  // namespace troupe
