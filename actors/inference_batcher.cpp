#include "actors/inference_batcher.hpp"

#include <algorithm>
#include <future>
#include <map>
#include <stdexcept>

#include "actors/rl_actor.hpp"
#include "collectives/idle_wait.hpp"
#include "devices/device_context.hpp"
#include "models/device_policy.hpp"

namespace troupe {

std::vector<inference_reply> infer_batch(inference_compute& c, const policy_head& head,
                                         uint64_t seed,
                                         const std::vector<const inference_request*>& batch,
                                         int64_t version) {
  int64_t rows = 0;
  for (const auto* r : batch) rows += r->observations.dim(0);
  const int64_t O = batch.empty() ? 0 : batch.front()->observations.dim(1);
  const int64_t P = head.outputs();
  c.observations.resize(static_cast<std::size_t>(rows * O));
  c.outputs.resize(static_cast<std::size_t>(rows * P));
  c.values.resize(static_cast<std::size_t>(rows));
  float* x = c.observations.data();
  for (const auto* r : batch)
    x = std::copy(r->observations.f32(), r->observations.f32() + r->observations.numel(), x);
  c.net->forward(c.observations.data(), rows, c.outputs.data(), c.values.data());
  const bool box = head.distribution == action_distribution::gaussian;
  std::vector<inference_reply> replies(batch.size());
  const float* out = c.outputs.data();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto& r = *batch[i];
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

std::vector<inference_reply> infer_batch(inference_compute& c, const policy_head& head,
                                         uint64_t seed, const std::vector<inference_request>& batch,
                                         int64_t version) {
  return infer_batch(c, head, seed, request_pointers(batch), version);
}

std::vector<const inference_request*> request_pointers(
    const std::vector<inference_request>& requests) {
  std::vector<const inference_request*> pointers;
  pointers.reserve(requests.size());
  for (const auto& r : requests) pointers.push_back(&r);
  return pointers;
}

std::string inference_request_problem(const inference_request& r, int64_t observation_size) {
  const auto& x = r.observations;
  if (x.rank() == 2 && x.dim(0) > 0 && x.dim(1) == observation_size && x.type() == dtype::f32)
    return {};
  return "rl_actor " + std::to_string(r.actor) + ": observations of shape " +
         shape_string(x.shape()) + " " + dtype_name(x.type()) + ", expected [M, " +
         std::to_string(observation_size) + "] float32";
}

inference_batcher::inference_batcher(settings s, std::unique_ptr<policy_value_model> net)
    : s_(std::move(s)) {
  compute_.net = std::move(net);
  if (s_.device.empty() || !parse_device(s_.device).discrete()) return;
  // The policy moves to the device, on the thread that makes its context.
  device_thread_ = std::make_shared<cpu_device>("inference:" + s_.device);
  on_compute_thread([this] {
    auto on_device = create_policy_value_model_on(discrete_device_context(s_.device), s_.model,
                                                  s_.observation_size, s_.head, s_.seed);
    policy_weights current{0, {}};
    for (const auto& v : compute_.net->variables()) current.values.push_back(v.value);
    install_policy_weights(*on_device, current);
    compute_.net = std::move(on_device);
  });
}

// The device's policy goes on the thread that made its context.
inference_batcher::~inference_batcher() {
  if (device_thread_) on_compute_thread([this] { compute_.net.reset(); });
}

// `work` on the thread that computes batches: the caller's, or (with a
// discrete device) the device's own, the caller waiting; its exception is
// the caller's.
void inference_batcher::on_compute_thread(const std::function<void()>& work) {
  if (!device_thread_) return work();
  std::promise<void> done;
  device_thread_->submit([&] {
    try {
      work();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  done.get_future().get();
}

inference_batcher::acting::acting(inference_batcher& b) : b_(b) {
  std::lock_guard<std::mutex> guard(b_.mu_);
  ++b_.acting_;
}

inference_batcher::acting::~acting() {
  {
    std::lock_guard<std::mutex> guard(b_.mu_);
    --b_.acting_;
  }
  // The batch may have been waiting for this actor only.
  b_.changed_.notify_all();
}

bool inference_batcher::batch_ready(clock::time_point now) const {
  // A server waiting for its turn goes next: the actors' batches, back to
  // back, would otherwise keep it waiting.
  if (running_ || server_waiting_ > 0 || version_ < 0 || queue_.empty()) return false;
  return static_cast<int64_t>(queue_.size()) >= acting_ || queued_rows_ >= s_.max_batch ||
         now >= queue_.front()->deadline;
}

inference_reply inference_batcher::infer(const inference_request& r) {
  if (auto why = inference_request_problem(r, s_.observation_size); !why.empty())
    throw std::invalid_argument(why);
  lock lk(mu_);
  if (!closed_.empty()) throw std::runtime_error(closed_);
  request_slot mine{&r, clock::now() + s_.max_wait, {}, {}};
  queue_.push_back(&mine);
  queued_rows_ += r.observations.dim(0);
  idle_wait idle(s_.yield_for);
  bool yielding = true;
  while (!mine.done) {
    if (!closed_.empty()) {
      auto queued = std::find(queue_.begin(), queue_.end(), &mine);
      if (queued != queue_.end()) {  // not in a batch: it leaves the queue
        queue_.erase(queued);
        queued_rows_ -= r.observations.dim(0);
        throw std::runtime_error(closed_);
      }
    } else if (batch_ready(clock::now())) {
      run_queued(lk);
      continue;
    }
    if (yielding) {  // spins or yields its core, without the lock
      lk.unlock();
      yielding = idle.look_again();
      lk.lock();
      continue;
    }
    wait_for_change(lk, mine);
    idle.reset();
    yielding = true;
  }
  if (!mine.error.empty()) throw std::runtime_error(mine.error);
  return std::move(mine.reply);
}

// Asleep until something changes: a batch ran, an actor stopped acting,
// weights came, or this request's wait is over (with no weights yet, it
// looks again now and then: a batch needs them).
void inference_batcher::wait_for_change(lock& lk, const request_slot& mine) {
  auto until = clock::now() + std::chrono::milliseconds(50);
  if (version_ >= 0 && !running_ && !queue_.empty())
    until = std::min(mine.deadline, queue_.front()->deadline);
  changed_.wait_until(lk, until);
}

// The queued requests (up to max_batch rows, at least one) as one batch, on
// this thread; their callers are woken with their replies.
void inference_batcher::run_queued(lock& lk) {
  std::vector<request_slot*> slots;
  std::vector<const inference_request*> batch;
  int64_t rows = 0;
  const bool overdue = clock::now() >= queue_.front()->deadline;
  while (!queue_.empty()) {
    const int64_t m = queue_.front()->request->observations.dim(0);
    if (!slots.empty() && rows + m > s_.max_batch) break;
    rows += m;
    slots.push_back(queue_.front());
    batch.push_back(queue_.front()->request);
    queue_.pop_front();
  }
  queued_rows_ -= rows;
  std::string error;
  std::vector<inference_reply> replies;
  try {
    replies = compute(batch, lk);
  } catch (const std::exception& e) {
    error = std::string("inference batch failed: ") + e.what();
  }
  // Counted with the batch (compute counts it), never ahead of it.
  if (overdue) ++ran_.overdue_batches;
  ++ran_.in_process_batches;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (error.empty()) slots[i]->reply = std::move(replies[i]);
    slots[i]->error = error;
    slots[i]->done = true;
  }
  changed_.notify_all();
}

// `batch` on the policy with the newest weights, outside the lock (running_
// keeps others off the compute state), on the device's own thread when the
// forward runs on a discrete device (a thread that only computes batches,
// so that a runner waiting for it never waits behind a waiter); the lock is
// held again on return.
std::vector<inference_reply> inference_batcher::compute(
    const std::vector<const inference_request*>& batch, lock& lk) {
  running_ = true;
  auto weights = std::move(weights_);
  weights_.reset();
  const int64_t version = version_;
  lk.unlock();
  std::vector<inference_reply> replies;
  std::exception_ptr error;
  try {
    on_compute_thread([&] {
      if (weights) install_policy_weights(*compute_.net, *weights);
      replies = infer_batch(compute_, s_.head, s_.seed, batch, version);
    });
  } catch (...) {
    error = std::current_exception();
  }
  lk.lock();
  running_ = false;
  ++ran_.batches;
  for (const auto* r : batch) ran_.rows += r->observations.dim(0);
  if (error) std::rethrow_exception(error);
  return replies;
}

// Until no batch computes (the server's turn comes after it).
void inference_batcher::wait_turn(lock& lk) {
  ++server_waiting_;
  changed_.wait(lk, [this] { return !running_ || !closed_.empty(); });
  --server_waiting_;
  if (!closed_.empty()) throw std::runtime_error(closed_);
}

std::vector<inference_reply> inference_batcher::infer_now(
    const std::vector<const inference_request*>& batch, bool overdue) {
  lock lk(mu_);
  wait_turn(lk);
  std::vector<inference_reply> replies;
  try {
    replies = compute(batch, lk);
  } catch (...) {
    changed_.notify_all();
    throw;
  }
  if (overdue) ++ran_.overdue_batches;
  changed_.notify_all();  // a batch of the actors' may be ready now
  return replies;
}

void inference_batcher::offer_weights(policy_weights w) {
  {
    std::lock_guard<std::mutex> guard(mu_);
    if (w.version <= version_) return;
    version_ = w.version;
    weights_ = std::move(w);
  }
  changed_.notify_all();
}

int64_t inference_batcher::version() const {
  std::lock_guard<std::mutex> guard(mu_);
  return version_;
}

void inference_batcher::close(const std::string& why) {
  {
    std::lock_guard<std::mutex> guard(mu_);
    if (closed_.empty()) closed_ = why.empty() ? "the inference server stopped" : why;
  }
  changed_.notify_all();
}

void inference_batcher::join_in_process() {
  std::lock_guard<std::mutex> guard(mu_);
  ++joined_;
}

int64_t inference_batcher::joined_in_process() const {
  std::lock_guard<std::mutex> guard(mu_);
  return joined_;
}

inference_stats inference_batcher::stats() const {
  std::lock_guard<std::mutex> guard(mu_);
  return ran_;
}

namespace {

struct local_batchers {
  std::mutex mu;
  std::map<caf::actor_addr, std::weak_ptr<inference_batcher>> by_server;
};

local_batchers& registry() {
  static local_batchers r;
  return r;
}

}  // namespace

void register_local_batcher(const caf::actor_addr& server,
                            std::shared_ptr<inference_batcher> batcher) {
  auto& r = registry();
  std::lock_guard<std::mutex> guard(r.mu);
  r.by_server[server] = std::move(batcher);
}

void forget_local_batcher(const caf::actor_addr& server) {
  auto& r = registry();
  std::lock_guard<std::mutex> guard(r.mu);
  r.by_server.erase(server);
}

std::shared_ptr<inference_batcher> find_local_batcher(const caf::actor_addr& server) {
  auto& r = registry();
  std::lock_guard<std::mutex> guard(r.mu);
  auto it = r.by_server.find(server);
  return it == r.by_server.end() ? nullptr : it->second.lock();
}

}  // namespace troupe
