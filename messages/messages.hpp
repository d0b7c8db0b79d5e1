#pragma once
// The message vocabulary of troupe: atoms, message structs and their
// serialization. Tensors serialize as one raw block (CAF 0.17's element-wise
// default is ~20x slower); inside a process they are moved, never copied.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "messages/reduce_op.hpp"
#include "messages/tensor.hpp"

namespace troupe {

// Atoms (CAF 0.17: at most 10 characters).
using train_atom = caf::atom_constant<caf::atom("train")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using next_atom = caf::atom_constant<caf::atom("next")>;
using state_atom = caf::atom_constant<caf::atom("state")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using computed_atom = caf::atom_constant<caf::atom("computed")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
// A worker of an asynchronous strategy comes back (troupe node: its process
// restarted): coordinator <- (worker index, its new replica).
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;
// The process was told to leave (runtime/preemption.hpp): coordinator <- the
// signal's name.
using preempt_atom = caf::atom_constant<caf::atom("preempt")>;
// Reducers (actors/reducer.hpp): collectives, statistics, reducer-to-reducer.
using allreduce_atom = caf::atom_constant<caf::atom("allreduce")>;
using broadcast_atom = caf::atom_constant<caf::atom("broadcast")>;
using reduce_scatter_atom = caf::atom_constant<caf::atom("rscatter")>;
using all_gather_atom = caf::atom_constant<caf::atom("agather")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using reduce_peer_atom = caf::atom_constant<caf::atom("rpeer")>;
using reduce_abort_atom = caf::atom_constant<caf::atom("rabort")>;
using reduce_left_atom = caf::atom_constant<caf::atom("rleft")>;

// One replica's share of one update: its slice of each of the update's
// micro-batches (one micro-batch unless gradients are accumulated). A slice
// may be empty (a partial last batch smaller than the number of replicas).
struct batch {
  int64_t epoch = 0;
  int64_t index = 0;        // update index within the epoch
  int64_t global_size = 0;  // examples in the whole update, all replicas (loss weighting)
  std::vector<tensor> x;    // per micro-batch: [b, features] float32
  std::vector<tensor> y;    // per micro-batch: [b] int32 class labels or [b, k] float targets
  // Per micro-batch: [b] int64, each row's index in the data set (what
  // dropout masks are drawn from, so they do not depend on the split).
  std::vector<tensor> ids;
  // data.gather "step": x and y are allocated, their rows not yet copied in;
  // the step's device task copies them (fill_rows) right before it reads
  // them, so the rows land in the cache of the core that computes on them and
  // no other thread takes a core from the replicas. Null: x and y are
  // filled. In-process only (never serialized: a pipeline feeds the replicas
  // of its own process).
  struct pending_rows {
    explicit pending_rows(std::function<void()> copy) : copy(std::move(copy)) {}
    std::once_flag once;
    std::function<void()> copy;
  };
  std::shared_ptr<pending_rows> pending;

  // Copies the pending rows in, once for all copies of this batch; what the
  // copy throws (a bad index) reaches the caller, and again any later one.
  void fill_rows() const {
    if (pending) std::call_once(pending->once, pending->copy);
  }
};

struct step_stats {
  int64_t step = 0;  // 0-based index of the step just done
  int64_t epoch = 0;
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t count = 0;
  double lr = 0;
};

// Sums of an evaluation or of sync-on-read training metrics.
struct metric_sums {
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t count = 0;
};

// Everything that makes a replica's training state: variables and optimizer
// slots, by name.
struct model_state {
  std::vector<named_tensor> variables;
  std::vector<named_tensor> slots;
  // The model's buffers (model::buffers(): batch norm's running statistics).
  std::vector<named_tensor> buffers;
};

// One reducer's counters (tests assert bucketing with them).
struct reducer_stats {
  int64_t collectives = 0;    // allreduce + broadcast calls finished (ok or failed)
  int64_t failed = 0;         // of those, ended with an error reply
  int64_t buckets = 0;        // fused buckets run (one run of the algorithm each)
  int64_t messages_sent = 0;  // messages sent to the other reducers of the group
  int64_t bytes_reduced = 0;  // payload bytes of the collectives that succeeded
};

// Reducer to reducer, inside one process: "in collective `seq`, step `kind`
// of bucket `bucket` is ready" (kind and arg belong to the algorithm; the
// data stays in the sender's buffers and the receiver reads it there).
struct reduce_peer_msg {
  uint64_t seq = 0;
  int32_t from = 0;
  int32_t bucket = 0;
  int32_t kind = 0;
  int64_t arg = 0;
};

// --- serialization (CAF 0.17 inspect) ---

caf::error inspect(caf::serializer& f, tensor& x);
caf::error inspect(caf::deserializer& f, tensor& x);
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor& x) {
  // Only for rendering (to_string); serialization uses the overloads above.
  std::string d = std::string(dtype_name(x.type())) + shape_string(x.shape());
  return f(caf::meta::type_name("tensor"), d);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, named_tensor& x) {
  return f(caf::meta::type_name("named_tensor"), x.name, x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, batch& x) {
  return f(caf::meta::type_name("batch"), x.epoch, x.index, x.global_size, x.x, x.y, x.ids);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_stats& x) {
  return f(caf::meta::type_name("step_stats"), x.step, x.epoch, x.loss_sum, x.correct, x.count,
           x.lr);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, metric_sums& x) {
  return f(caf::meta::type_name("metric_sums"), x.loss_sum, x.correct, x.count);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_state& x) {
  return f(caf::meta::type_name("model_state"), x.variables, x.slots, x.buffers);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reducer_stats& x) {
  return f(caf::meta::type_name("reducer_stats"), x.collectives, x.failed, x.buckets,
           x.messages_sent, x.bytes_reduced);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reduce_peer_msg& x) {
  return f(caf::meta::type_name("reduce_peer_msg"), x.seq, x.from, x.bucket, x.kind, x.arg);
}

inline bool operator==(const named_tensor& a, const named_tensor& b) {
  return a.name == b.name && a.value == b.value;
}

// A CAF error as users should read it: the message text troupe put in it
// (e.g. "replica 0: injected failure at step 5"), else CAF's rendering.
std::string describe(const caf::error& e);

// Registers every message type of the system with CAF (one place, so any
// message can cross a process boundary). Call in every process.
void register_messages(caf::actor_system_config& cfg);

}  // namespace troupe

// --- Variable shards (actors/variable_shard.hpp): parameter_server and
// central_storage. Kept in their own block so the shard protocol reads in one
// place. ---
namespace troupe {

using push_atom = caf::atom_constant<caf::atom("push")>;
using pull_atom = caf::atom_constant<caf::atom("pull")>;
using aggregate_atom = caf::atom_constant<caf::atom("aggregate")>;
using exchange_atom = caf::atom_constant<caf::atom("exchange")>;

// A pull's answer: the shard's version (updates applied) when it answered,
// and the requested pieces at that version.
struct shard_values {
  int64_t version = 0;
  std::vector<named_tensor> values;
};

// A shard's checkpoint: its pieces, the optimizer slots of those pieces
// ("<piece>/momentum", ..., plus "optimizer/step") and its version.
struct shard_state {
  int64_t version = 0;
  std::vector<named_tensor> variables;
  std::vector<named_tensor> slots;
};

// A shard's counters since it started (restores do not reset them).
// Staleness of a push = shard version when it is applied - the version its
// gradient was computed from (0 = fresh).
struct shard_stats {
  int64_t version = 0;
  int64_t pushes = 0;    // accepted pushes
  int64_t pulls = 0;     // answered pulls
  int64_t applies = 0;   // optimizer updates (async: one per push; aggregate: one per step)
  int64_t rejected = 0;  // pushes and pulls answered with an error
  int64_t bytes_in = 0;  // gradient bytes of accepted pushes
  int64_t bytes_out = 0;
  int64_t staleness_max = 0;
  double staleness_mean = 0;
  // Pushes by staleness: [0] = 0, [i] = [2^(i-1), 2^i) for 1 <= i < 15,
  // [15] = 2^14 and above.
  std::vector<int64_t> staleness_histogram;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_values& x) {
  return f(caf::meta::type_name("shard_values"), x.version, x.values);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_state& x) {
  return f(caf::meta::type_name("shard_state"), x.version, x.variables, x.slots);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_stats& x) {
  return f(caf::meta::type_name("shard_stats"), x.version, x.pushes, x.pulls, x.applies, x.rejected,
           x.bytes_in, x.bytes_out, x.staleness_max, x.staleness_mean, x.staleness_histogram);
}

}  // namespace troupe
