// The reducer actors behind the collective layer (actors/reducer_group.hpp).
#include "actors/reducer_group.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/reducer.hpp"
#include "devices/device.hpp"
#include "trace/trace.hpp"

namespace troupe {
namespace {

// A caller's buffer that did not start on 64 bytes: the actors work on an
// aligned copy, copied back when the reply comes.
struct staged_copy {
  float* dst = nullptr;
  tensor copy;
};

// The tensors of one request over the caller's buffers.
struct request_buffers {
  std::vector<tensor> tensors;
  std::vector<staged_copy> staged;
};

void add_buffer(request_buffers& rb, float* data, std::size_t n, const buffer_owner_fn& owners) {
  const shape_t shape{static_cast<int64_t>(n)};
  if (n == 0 || reinterpret_cast<std::uintptr_t>(data) % 64 == 0) {
    // The buffer's owner where the caller names it, so that a reducer still
    // touching it after an abort woke the caller touches live memory; else
    // an owner that frees nothing. Either has a reference count the reducer
    // touches after its last write, and the reply is dropped here, which
    // shows the hand-over to ThreadSanitizer (the reply's mailbox, CAF's, is
    // not instrumented).
    std::shared_ptr<const void> owner = owners ? owners(data, n) : nullptr;
    rb.tensors.push_back(tensor::wrap(
        shape, dtype::f32,
        owner ? std::shared_ptr<void>(owner, data) : std::shared_ptr<void>(data, [](void*) {})));
    return;
  }
  auto copy = tensor::uninitialized(shape);
  std::memcpy(copy.f32(), data, n * sizeof(float));
  rb.staged.push_back({data, copy});
  rb.tensors.push_back(std::move(copy));
}

class reducer_process_group final : public process_group {
 public:
  reducer_process_group(caf::actor_system& sys, caf::actor reducer, reducer_group_options o)
      : self_(sys, true), reducer_(std::move(reducer)), opts_(o) {}

  ~reducer_process_group() override {
    if (!pending_.empty()) abort("the reducer group was closed with collectives in flight");
  }

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  memory_kind memory() const override { return memory_kind::host; }
  bool completes_on_its_own() const override { return true; }

  void all_reduce(float* data, std::size_t n, reduce_op op) override {
    issue_all_reduce(data, n, op).wait();
  }
  void reduce_scatter(float* data, std::size_t chunk, reduce_op op) override {
    issue_reduce_scatter(data, chunk, op).wait();
  }
  void all_gather(float* data, std::size_t chunk) override { issue_all_gather(data, chunk).wait(); }
  void broadcast(float* data, std::size_t n, int root) override {
    issue_broadcast(data, n, root).wait();
  }
  // One request: the reducer fuses the spans into its own buckets.
  void all_reduce_spans(const std::vector<float_span>& spans, reduce_op op) override {
    for (const auto& s : spans) issue_all_reduce(s.data, s.size, op);
    complete();
  }

  work issue_all_reduce(float* data, std::size_t n, reduce_op op) override {
    check();
    const auto k = static_cast<std::size_t>(op);
    if (k >= reduces_.size())
      throw device_error("reducer collectives: all_reduce on rank " + std::to_string(rank()) +
                         ": unknown reduce op " + std::to_string(k));
    return add(reduces_[k], data, n);
  }
  // Every chunk reduced: rank r's among them.
  work issue_reduce_scatter(float* data, std::size_t chunk, reduce_op op) override {
    return issue_all_reduce(data, chunk * static_cast<std::size_t>(size()), op);
  }
  // The other ranks' chunks zeroed, then summed: each rank's chunk exact
  // everywhere (x + 0 is x), in the step's one batched all-reduce rather
  // than one broadcast per rank and variable.
  work issue_all_gather(float* data, std::size_t chunk) override {
    const auto n = static_cast<std::size_t>(size());
    for (std::size_t p = 0; p < n; ++p)
      if (p != static_cast<std::size_t>(rank())) std::fill_n(data + p * chunk, chunk, 0.0f);
    return issue_all_reduce(data, chunk * n, reduce_op::sum);
  }
  work issue_broadcast(float* data, std::size_t n, int root) override {
    check_root(root);
    check();
    if (broadcasts_.empty()) broadcasts_.resize(static_cast<std::size_t>(size()));
    return add(broadcasts_[static_cast<std::size_t>(root)], data, n);
  }

  // ZeRO-1 in the reducers' own layout: their segments of the gradients
  // as one buffer in the model's order (reduce_scatter_segments), one
  // reduce-scatter request for a step's variables however backward issued
  // them, one all-gather request.
  element_ranges shard_ranges(const std::vector<float_span>& grads) override {
    order_.clear();
    int64_t total = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      order_[grads[i].data] = i;
      total += static_cast<int64_t>(grads[i].size);
    }
    reducer_config rc;
    rc.bucket_bytes = static_cast<int64_t>(opts_.coalesce_bytes);
    return reduce_scatter_segments(total, rc, size(), rank());
  }
  work issue_reduce_scatter_spans(const std::vector<float_span>& spans, reduce_op op) override {
    check();
    for (const auto& s : spans) {
      if (!order_.contains(s.data))
        throw device_error("reducer collectives: reduce_scatter_spans on rank " +
                           std::to_string(rank()) + " of a span shard_ranges was not given");
      if (!scatter_.empty() && scatter_.front().second != op)
        throw device_error("reducer collectives: reduce_scatter_spans with two reduce ops");
      scatter_.emplace_back(s, op);
    }
    return issued();
  }
  work issue_all_gather_spans(const std::vector<float_span>& spans) override {
    check();
    request_buffers rb;
    for (const auto& s : spans) add_buffer(rb, s.data, s.size, opts_.buffer_owners);
    send("all_gather", std::move(rb), all_gather_atom::value);
    return issued();
  }

  void complete() override { wait_for(issued_count()); }
  void check() override {
    std::lock_guard lock(mtx_);
    if (!aborted_.empty()) throw device_error("reducer collectives: " + aborted_);
  }

  // Takes this rank out of its reducer's group (the peers fail the
  // collective they wait in) and fails this rank's replies still to come.
  void abort(const std::string& why) override { end(why, true); }
  void stop_waiting(const std::string& why) override { end(why, false); }

 protected:
  // Sends what is still batched, then receives every reply: all of them,
  // so that a failed collective leaves the group in step; then throws the
  // first error. (Batches are sent out of issue order, so waiting for one
  // collective waits for all: their buffers are disjoint until waited for,
  // and every rank batches alike.)
  void wait_for(uint64_t) override {
    flush_all();
    std::string failure;
    // The wait is the collectives' cost on this thread (a trace's and troupe
    // report's all-reduce share), as the host group shows it.
    std::optional<trace::scoped_span> waiting;
    if (!pending_.empty())
      waiting.emplace(trace::this_thread_track(), "collective_wait", trace::category::communicate);
    while (!pending_.empty()) {
      auto p = std::move(pending_.front());
      pending_.pop_front();
      std::string error = receive(p);
      if (failure.empty() && !error.empty()) failure = std::move(error);
    }
    if (!failure.empty()) throw device_error(failure);
    check();
  }

 private:
  using reply_handle = decltype(std::declval<caf::scoped_actor&>()->request(
      std::declval<caf::actor&>(), caf::infinite, allreduce_atom::value, reduce_op::sum,
      std::vector<tensor>{}));

  struct pending_request {
    const char* what = "";
    reply_handle reply;
    std::vector<staged_copy> staged;
  };

  // Issued collectives of one kind not sent yet: one request to the reducer
  // for all of them (the reducer fuses a request's tensors into its own
  // buckets), sent when it holds coalesce_bytes or at the wait, as DDP's
  // buckets go. A step's per-layer all-reduces thus cost one collective of
  // the actors, not one per variable.
  struct batch {
    request_buffers rb;
    std::size_t bytes = 0;
  };

  work add(batch& b, float* data, std::size_t n) {
    add_buffer(b.rb, data, n, opts_.buffer_owners);
    b.bytes += n * sizeof(float);
    if (b.bytes >= opts_.coalesce_bytes) flush_all();
    return issued();
  }

  void end(const std::string& why, bool tell_peers) {
    std::lock_guard lock(mtx_);
    if (!aborted_.empty()) return;
    aborted_ = why.empty() ? std::string("aborted") : why;
    if (tell_peers && opts_.tell_abort)
      opts_.tell_abort(reducer_, aborted_);
    else if (tell_peers)
      caf::anon_send(reducer_, reduce_abort_atom::value, aborted_);
    for (auto id : in_flight_)
      self_.ptr()->eq_impl(id, nullptr, nullptr, caf::make_error(caf::sec::request_receiver_down));
  }

  // The step's reduce-scatter: its variables in the model's order.
  void flush_scatter() {
    if (scatter_.empty()) return;
    std::sort(scatter_.begin(), scatter_.end(), [&](const auto& a, const auto& b) {
      return order_.at(a.first.data) < order_.at(b.first.data);
    });
    request_buffers rb;
    for (const auto& entry : scatter_)
      add_buffer(rb, entry.first.data, entry.first.size, opts_.buffer_owners);
    const reduce_op op = scatter_.front().second;
    scatter_.clear();
    send("reduce_scatter", std::move(rb), reduce_scatter_atom::value, op);
  }

  // The reduce-scatter, then all-reduces by op, then broadcasts by root:
  // the same order on every rank.
  void flush_all() {
    flush_scatter();
    for (std::size_t op = 0; op < reduces_.size(); ++op)
      if (!reduces_[op].rb.tensors.empty())
        send("all_reduce", std::exchange(reduces_[op], {}).rb, allreduce_atom::value,
             static_cast<reduce_op>(op));
    for (std::size_t root = 0; root < broadcasts_.size(); ++root)
      if (!broadcasts_[root].rb.tensors.empty())
        send("broadcast", std::exchange(broadcasts_[root], {}).rb, broadcast_atom::value,
             static_cast<int32_t>(root));
  }

  template <class... Ts>
  void send(const char* what, request_buffers rb, Ts... head) {
    auto reply = self_->request(reducer_, opts_.timeout, head..., std::move(rb.tensors));
    {
      // An abort between check() and here has no id of this request: fail
      // it now, or its wait would wait for a reducer that left.
      std::lock_guard lock(mtx_);
      in_flight_.push_back(reply.id());
      if (!aborted_.empty())
        self_.ptr()->eq_impl(reply.id(), nullptr, nullptr,
                             caf::make_error(caf::sec::request_receiver_down));
    }
    pending_.push_back({what, reply, std::move(rb.staged)});
  }

  // The reply to one request: empty when it succeeded, else what failed.
  std::string receive(pending_request& p) {
    std::string error;
    p.reply.receive([](std::vector<tensor>&) {},
                    [&](caf::error& e) {
                      error = std::string("reducer collectives: ") + p.what + " on rank " +
                              std::to_string(rank()) + " failed: " + describe(e);
                    });
    {
      std::lock_guard lock(mtx_);
      std::erase(in_flight_, p.reply.id());
      if (!error.empty() && !aborted_.empty()) error = "reducer collectives: " + aborted_;
    }
    if (error.empty())
      for (auto& s : p.staged)
        std::memcpy(s.dst, s.copy.f32(), static_cast<std::size_t>(s.copy.numel()) * sizeof(float));
    return error;
  }

  // Hidden: a group is no actor of the job, and must not hold up the wait
  // for the job's actors to end (actor_registry's running count).
  caf::scoped_actor self_;
  caf::actor reducer_;
  reducer_group_options opts_;
  std::array<batch, 4> reduces_;   // by reduce_op; the calling thread's only
  std::vector<batch> broadcasts_;  // by root; the calling thread's only
  // ZeRO-1: each gradient's place in the model (shard_ranges), and the
  // reduce-scatter issued since the last wait. The calling thread's only.
  std::unordered_map<const float*, std::size_t> order_;
  std::vector<std::pair<float_span, reduce_op>> scatter_;
  std::deque<pending_request> pending_;  // sent, the reply to come; the calling thread's only
  std::mutex mtx_;
  std::vector<caf::message_id> in_flight_;  // under mtx_ (abort() reads it)
  std::string aborted_;                     // under mtx_
};

}  // namespace

std::unique_ptr<process_group> make_reducer_group(caf::actor_system& sys, caf::actor reducer,
                                                  reducer_group_options opts) {
  if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
    throw device_error("reducer group: rank " + std::to_string(opts.rank) + " of a group of " +
                       std::to_string(opts.size));
  if (!reducer)
    throw device_error("reducer group: rank " + std::to_string(opts.rank) + " has no reducer");
  return std::make_unique<reducer_process_group>(sys, std::move(reducer), opts);
}

std::unique_ptr<process_group> make_ring_node_group(const ring_node_actor& node, int rank, int size,
                                                    caf::duration timeout,
                                                    buffer_owner_fn buffer_owners) {
  reducer_group_options o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.buffer_owners = std::move(buffer_owners);
  o.tell_abort = [rank](const caf::actor& n, const std::string& why) {
    caf::anon_send(n, ring_abort_atom::value, uint64_t{0}, static_cast<int32_t>(rank), why);
  };
  auto a = caf::actor_cast<caf::actor>(node);
  if (!a) throw device_error("ring node group: rank " + std::to_string(rank) + " has no ring node");
  return make_reducer_group(a->home_system(), a, std::move(o));
}

}  // namespace troupe
