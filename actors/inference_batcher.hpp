#pragma once
// inference_batcher: the inference server's policy and its batches, shared
// with the rl_actors of the server's own process. Those ask it from their
// device threads, without a message: central inference's fast path below
// the actor protocol, as the direct links are the collectives'
// (docs/strategies.md, "Central inference").
//
// Why: a CartPole step of 64 environments computes in ~10 us, and by
// message it made six thread hand-overs (actor -> its device -> actor ->
// server -> the server's device -> server -> actor), each a scheduler's
// wake: on 2 vCPUs central inference ran 10x slower than local inference
// with the actors alone (bench/README.md). Here a step makes at most one:
// the actor whose request completes a batch runs the batch on its own
// thread (combining), and the others wait for it, yielding their core for
// a while before they sleep (collectives/idle_wait.hpp).
//
// The batch rule is the server's: a batch runs once it holds max_batch
// rows, once every actor that is acting an unroll has asked, or once its
// oldest request waited max_wait. "Acting" (the `acting` guard around an
// unroll) is what the batch waits for: an actor that offers its unroll to
// the queue, or waits for credit, holds nobody back. One batch computes at
// a time; the server's own batches (requests from other processes, by
// message) take their turn through infer_now. The actions of an actor are
// sampled from its own stream (infer_batch), so they are the same whichever
// path and batch they ran in.
//
// Threads: every member may be called from any thread. infer blocks its
// caller (a device thread of its own: an actor never asks from a thread
// another acting actor needs) until its batch ran, never for ever: a batch
// whose wait is over runs with what it holds, and close() ends every wait.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_addr.hpp>

#include "devices/device.hpp"
#include "envs/policy_head.hpp"
#include "messages/rl_messages.hpp"
#include "models/policy_value.hpp"
#include "models/random.hpp"

namespace troupe {

// The server's device state: its policy (computing on the server's
// discrete device, when it has one), each actor's sampling stream, and
// scratch for a batch.
struct inference_compute {
  std::unique_ptr<policy_value_model> net;
  std::map<int64_t, splitmix64> streams;  // by actor index
  std::vector<float> observations, outputs, values, probs;
};

// One batch on the server's policy: the outputs of `c`'s policy on every
// request's observations in one forward, and each request's actions sampled
// from its actor's stream (epsilon-greedy on the outputs as Q-values with a
// request's epsilon >= 0; none with outputs_only).
std::vector<inference_reply> infer_batch(inference_compute& c, const policy_head& head,
                                         uint64_t seed,
                                         const std::vector<const inference_request*>& batch,
                                         int64_t version);
// The same over requests by value (tests).
std::vector<inference_reply> infer_batch(inference_compute& c, const policy_head& head,
                                         uint64_t seed, const std::vector<inference_request>& batch,
                                         int64_t version);

// The requests as the batch functions take them (pointers into `requests`).
std::vector<const inference_request*> request_pointers(
    const std::vector<inference_request>& requests);

// Why a request does not fit a policy over `observation_size` inputs, or "".
std::string inference_request_problem(const inference_request& r, int64_t observation_size);

class inference_batcher {
 public:
  using clock = std::chrono::steady_clock;
  struct settings {
    policy_head head;
    uint64_t seed = 0;  // the job's: every actor's sampling stream derives from it
    int64_t observation_size = 0;
    int64_t max_batch = 4096;
    std::chrono::microseconds max_wait{2000};
    // How long a waiting actor yields its core before it sleeps.
    std::chrono::microseconds yield_for{200};
    // A discrete device (sim:N, cuda:N) runs the forward, on a thread of
    // the batcher's own that makes the device's context and only computes
    // batches: a batch's runner hands it over and waits. Empty: the host
    // kernels, on the runner's own thread.
    std::string device;
    model_config model;
  };

  inference_batcher(settings s, std::unique_ptr<policy_value_model> net);
  ~inference_batcher();
  inference_batcher(const inference_batcher&) = delete;
  inference_batcher& operator=(const inference_batcher&) = delete;

  // Held while an actor acts an unroll: batches wait for its requests.
  class acting {
   public:
    explicit acting(inference_batcher& b);
    ~acting();
    acting(const acting&) = delete;
    acting& operator=(const acting&) = delete;

   private:
    inference_batcher& b_;
  };

  // `r`'s outputs and actions, from a batch with the other acting actors'
  // requests; blocks until the batch ran (on this thread or another).
  // Throws the batch's error, an invalid request's, or close()'s reason.
  inference_reply infer(const inference_request& r);
  // The server's own batch, now (after the batch computing, if any).
  std::vector<inference_reply> infer_now(const std::vector<const inference_request*>& batch,
                                         bool overdue);
  // Newer weights: installed before the next batch runs.
  void offer_weights(policy_weights w);
  // The newest weights offered (-1: none yet; requests wait for some).
  int64_t version() const;
  // No more batches: every waiter, and every later call, throws `why`.
  void close(const std::string& why);
  // Batches and rows run so far, by either path.
  inference_stats stats() const;
  // An rl_actor of this process that will ask through the batcher, once
  // (the server's message batches no longer wait for it), and how many did;
  // counted for good (an actor of the server's process is not restarted).
  void join_in_process();
  int64_t joined_in_process() const;

 private:
  struct request_slot {
    const inference_request* request;
    clock::time_point deadline;
    inference_reply reply;
    std::string error;
    bool done = false;
  };
  using lock = std::unique_lock<std::mutex>;
  bool batch_ready(clock::time_point now) const;
  void run_queued(lock& lk);
  std::vector<inference_reply> compute(const std::vector<const inference_request*>& batch,
                                       lock& lk);
  void on_compute_thread(const std::function<void()>& work);
  void wait_turn(lock& lk);
  void wait_for_change(lock& lk, const request_slot& mine);

  const settings s_;
  std::shared_ptr<cpu_device> device_thread_;  // with a discrete device
  mutable std::mutex mu_;
  std::condition_variable changed_;
  inference_compute compute_;  // touched only by the thread that set running_
  std::deque<request_slot*> queue_;
  int64_t queued_rows_ = 0;
  int64_t acting_ = 0;
  int64_t joined_ = 0;  // rl_actors of this process that ask here
  bool running_ = false;
  int64_t server_waiting_ = 0;             // infer_now calls waiting for their turn
  std::optional<policy_weights> weights_;  // newer than the installed ones
  int64_t version_ = -1;
  std::string closed_;  // why, once closed
  inference_stats ran_;
};

// The batchers of this process's inference servers, by the server's
// address: an rl_actor that finds its server here asks the batcher, and one
// that does not (the server is in another process) sends messages.
void register_local_batcher(const caf::actor_addr& server,
                            std::shared_ptr<inference_batcher> batcher);
void forget_local_batcher(const caf::actor_addr& server);
std::shared_ptr<inference_batcher> find_local_batcher(const caf::actor_addr& server);

}  // namespace troupe
