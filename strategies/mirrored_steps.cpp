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

std::vector<float_span> spans_of(std::vector<tensor> ts) {
  std::vector<float_span> out;
  out.reserve(ts.size());
  for (auto& t : ts) out.push_back({t.f32(), static_cast<std::size_t>(t.numel())});
  return out;
}

std::vector<float_span> gradient_spans(compute_state& cs) {
  std::vector<float_span> out;
  for (auto& g : cs.grads)
    out.push_back({g.value.f32(), static_cast<std::size_t>(g.value.numel())});
  return out;
}

}  // namespace

element_ranges own_shard_ranges(compute_state& cs, process_group& comm) {
  return comm.shard_ranges(gradient_spans(cs));
}

void reduce_scatter_gradients(compute_state& cs, process_group& comm, std::size_t first,
                              std::size_t last) {
  const auto all = gradient_spans(cs);
  std::vector<float_span> spans;
  for (std::size_t i = last; i-- > first;) spans.push_back(all[i]);  // as all_reduce_gradients
  comm.issue_reduce_scatter_spans(spans, reduce_op::sum);
}

void gather_variables(compute_state& cs, process_group& comm) {
  std::vector<tensor> vars;
  for (auto& v : cs.net->variables()) vars.push_back(v.value);
  comm.issue_all_gather_spans(spans_of(std::move(vars)));
  if (comm.completes_on_its_own())
    cs.variables_in_flight = &comm;
  else
    comm.complete();
}

void gather_slots(compute_state& cs, process_group& comm) {
  for (std::size_t kind = 0; kind < cs.opt->slot_names().size(); ++kind)
    comm.issue_all_gather_spans(spans_of(cs.opt->slot_tensors(kind)));
  comm.complete();
}

}  // namespace troupe
