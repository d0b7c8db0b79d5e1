// What the mirrored strategy's steps share (strategies/mirrored_steps.hpp).
#include "strategies/mirrored_steps.hpp"

#include <algorithm>

namespace troupe {

void step_on_device(replica_host& h, const char* span, int64_t epoch,
                    std::function<step_stats(compute_state&)> work,
                    std::function<void(step_stats&)> then) {
  h.on_device<step_stats>(span, std::move(work),
                          [&h, epoch, then = std::move(then)](step_stats& s) {
                            s.epoch = epoch;
                            h.count(s);
                            then(s);
                          });
}

void gradients_for_reducer(replica_host& h, int64_t step, batch b,
                           std::function<void(step_stats&)> then) {
  auto epoch = b.epoch;
  step_on_device(
      h, "forward_backward", epoch,
      [b = std::move(b), step, fail = h.fail_at_step()](compute_state& cs) {
        auto s = compute_gradients(cs, b, step, fail, false);
        cs.gradients_to_host();  // for the reducer (nothing to do on cpu:N)
        return s;
      },
      std::move(then));
}

device_group_step::device_group_step(replica_wiring w, reducer_config rc)
    : wiring_(std::move(w)), reducer_cfg_(rc) {}

device_group_step::~device_group_step() {
  const std::string why = "replica " + std::to_string(wiring_.index) + " stopped";
  wiring_.device_group->abort(why);
  // The links too: a device thread waiting on another process must not keep
  // this one from ending (the peers then fail at once, their links closed).
  if (wiring_.process_links) wiring_.process_links->abort(why);
}

void device_group_step::init(compute_state& cs) {
  cs.collectives = wiring_.device_group->join(
      static_cast<int>(wiring_.device_group_global ? wiring_.index : wiring_.local_index), *cs.dev);
}

std::size_t device_group_step::bucket_floats() const {
  return std::max<std::size_t>(1, static_cast<std::size_t>(reducer_cfg_.bucket_bytes) / 4);
}

step_stats gradients_reduced_in_backward(
    compute_state& cs, const batch& b, int64_t step, int64_t fail_at_step,
    const std::function<void(std::size_t, std::size_t)>& reduce) {
  std::size_t unreduced = cs.grads.size();
  auto s =
      compute_gradients(cs, b, step, fail_at_step, false, [&](std::size_t first, std::size_t last) {
        if (last != unreduced) return;  // out of order: later
        reduce(first, last);
        unreduced = first;
      });
  reduce(0, unreduced);
  return s;
}

void all_reduce_gradients(compute_state& cs, device_communicator& comm, std::size_t bucket,
                          std::size_t first, std::size_t last) {
  if (first >= last) return;
  auto reduce = [&](float* p, std::size_t n) {
    for (std::size_t at = 0; at < n; at += bucket)
      comm.issue_all_reduce(p + at, std::min(bucket, n - at), reduce_op::sum);
  };
  auto numel = [&](std::size_t i) { return static_cast<std::size_t>(cs.grads[i].value.numel()); };
  if (cs.discrete()) {
    auto ptrs = cs.net->device_gradients();
    if (cs.net->device_gradient_block()) {  // [first, last) is one run of the block
      std::size_t total = 0;
      for (std::size_t i = first; i < last; ++i) total += numel(i);
      reduce(ptrs[first], total);
      return;
    }
    for (std::size_t i = first; i < last; ++i) reduce(ptrs[i], numel(i));
    return;
  }
  for (std::size_t i = first; i < last; ++i) reduce(cs.grads[i].value.f32(), numel(i));
}

void zero_gradients(compute_state& cs) {
  if (!cs.discrete()) {
    for (auto& g : cs.grads) g.value.fill(0.0f);
    return;
  }
  auto ptrs = cs.net->device_gradients();
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    cs.dev->ops().fill(ptrs[i], 0.0f, static_cast<std::size_t>(cs.grads[i].value.numel()));
}

namespace {

bool splits(compute_state& cs, device_communicator& comm, std::size_t i) {
  const auto n = cs.grads[i].value.numel();
  return comm.size() > 1 && n >= comm.size() && n % comm.size() == 0;
}

std::size_t chunk_of(compute_state& cs, device_communicator& comm, std::size_t i) {
  return static_cast<std::size_t>(cs.grads[i].value.numel() / comm.size());
}

}  // namespace

element_ranges device_shard_ranges(compute_state& cs, device_communicator& comm) {
  element_ranges out;
  int64_t at = 0;
  for (std::size_t i = 0; i < cs.grads.size(); ++i) {
    const int64_t n = cs.grads[i].value.numel();
    if (splits(cs, comm, i)) {
      const auto c = static_cast<int64_t>(chunk_of(cs, comm, i));
      out.emplace_back(at + comm.rank() * c, at + (comm.rank() + 1) * c);
    } else if (n > 0) {
      out.emplace_back(at, at + n);
    }
    at += n;
  }
  return out;
}

void reduce_scatter_gradients(compute_state& cs, device_communicator& comm, std::size_t first,
                              std::size_t last) {
  for (std::size_t i = first; i < last; ++i) {
    float* g = cs.grads[i].value.f32();
    if (splits(cs, comm, i))
      comm.issue_reduce_scatter(g, chunk_of(cs, comm, i), reduce_op::sum);
    else
      comm.issue_all_reduce(g, static_cast<std::size_t>(cs.grads[i].value.numel()), reduce_op::sum);
  }
}

void gather_variables(compute_state& cs, device_communicator& comm) {
  auto& vars = cs.net->variables();
  for (std::size_t i = 0; i < vars.size(); ++i)
    if (splits(cs, comm, i)) comm.issue_all_gather(vars[i].value.f32(), chunk_of(cs, comm, i));
  comm.complete();
}

void gather_slots(compute_state& cs, device_communicator& comm) {
  for (std::size_t kind = 0; kind < cs.opt->slot_names().size(); ++kind) {
    auto slots = cs.opt->slot_tensors(kind);
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (splits(cs, comm, i)) comm.issue_all_gather(slots[i].f32(), chunk_of(cs, comm, i));
  }
  comm.complete();
}

}  // namespace troupe
