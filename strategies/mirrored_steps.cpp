// What the mirrored strategy's steps share (strategies/mirrored_steps.hpp).
#include "strategies/mirrored_steps.hpp"

#include <algorithm>

namespace troupe {

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

step_stats gradients_reduced_on_host(compute_state& cs, process_group& group, const batch& b,
                                     int64_t step, int64_t fail_at_step) {
  auto s = compute_gradients(cs, b, step, fail_at_step, false);
  cs.gradients_to_host();
  std::vector<float_span> spans;
  spans.reserve(cs.grads.size());
  for (auto& g : cs.grads)
    spans.push_back({g.value.f32(), static_cast<std::size_t>(g.value.numel())});
  group.all_reduce_spans(spans, reduce_op::sum);
  return s;
}

void all_reduce_gradients(compute_state& cs, process_group& group, std::size_t bucket,
                          std::size_t first, std::size_t last) {
  auto ptrs = cs.discrete() ? cs.net->device_gradients() : std::vector<float*>{};
  // Variable by variable from the last: the same collectives on every rank
  // however its backward cut the ranges (a rank with an empty batch reports
  // none).
  for (std::size_t i = last; i-- > first;) {
    float* p = cs.discrete() ? ptrs[i] : cs.grads[i].value.f32();
    const auto n = static_cast<std::size_t>(cs.grads[i].value.numel());
    for (std::size_t at = 0; at < n; at += bucket)
      group.issue_all_reduce(p + at, std::min(bucket, n - at), reduce_op::sum);
  }
}

namespace {

bool splits(compute_state& cs, process_group& comm, std::size_t i) {
  const auto n = cs.grads[i].value.numel();
  return comm.size() > 1 && n >= comm.size() && n % comm.size() == 0;
}

std::size_t chunk_of(compute_state& cs, process_group& comm, std::size_t i) {
  return static_cast<std::size_t>(cs.grads[i].value.numel() / comm.size());
}

}  // namespace

element_ranges device_shard_ranges(compute_state& cs, process_group& comm) {
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

void reduce_scatter_gradients(compute_state& cs, process_group& comm, std::size_t first,
                              std::size_t last) {
  for (std::size_t i = last; i-- > first;) {  // as all_reduce_gradients
    float* g = cs.grads[i].value.f32();
    if (splits(cs, comm, i))
      comm.issue_reduce_scatter(g, chunk_of(cs, comm, i), reduce_op::sum);
    else
      comm.issue_all_reduce(g, static_cast<std::size_t>(cs.grads[i].value.numel()), reduce_op::sum);
  }
}

void gather_variables(compute_state& cs, process_group& comm) {
  auto& vars = cs.net->variables();
  for (std::size_t i = 0; i < vars.size(); ++i)
    if (splits(cs, comm, i)) comm.issue_all_gather(vars[i].value.f32(), chunk_of(cs, comm, i));
  comm.complete();
}

void gather_slots(compute_state& cs, process_group& comm) {
  for (std::size_t kind = 0; kind < cs.opt->slot_names().size(); ++kind) {
    auto slots = cs.opt->slot_tensors(kind);
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (splits(cs, comm, i)) comm.issue_all_gather(slots[i].f32(), chunk_of(cs, comm, i));
  }
  comm.complete();
}

}  // namespace troupe
