// make_device_rendezvous: the group for a kind of device
// (collectives/process_group.hpp); the reduce ops they all take; and the NCCL entry points of
// collectives/nccl_id.hpp in a build without NCCL.
#include "collectives/process_group.hpp"

#include <algorithm>

#include "collectives/host_group.hpp"
#include "collectives/nccl_id.hpp"

namespace troupe {

namespace {
constexpr const char* no_nccl = "cuda devices need NCCL: this build has none";
}  // namespace

void work::wait() {
  if (group_ != nullptr) group_->wait_for(ticket_);
}

void process_group::check_root(int root) const {
  if (root < 0 || root >= size())
    throw device_error("broadcast: root " + std::to_string(root) + " is outside the group of " +
                       std::to_string(size()) + " ranks");
}

void process_group::broadcast(float* data, std::size_t n, int root) {
  check_root(root);
  if (rank() != root) std::fill(data, data + n, 0.0f);
  all_reduce(data, n, reduce_op::sum);
}

namespace {

// Whether the ranks divide a variable of n elements into a chunk each.
bool splits(const process_group& g, std::size_t n) {
  const auto k = static_cast<std::size_t>(g.size());
  return k > 1 && n >= k && n % k == 0;
}

}  // namespace

process_group::element_ranges process_group::shard_ranges(const std::vector<float_span>& grads) {
  element_ranges out;
  int64_t at = 0;
  for (const auto& g : grads) {
    const auto n = static_cast<int64_t>(g.size);
    if (splits(*this, g.size)) {
      const int64_t c = n / size();
      out.emplace_back(at + rank() * c, at + (rank() + 1) * c);
    } else if (n > 0) {
      out.emplace_back(at, at + n);
    }
    at += n;
  }
  return out;
}

work process_group::issue_reduce_scatter_spans(const std::vector<float_span>& spans, reduce_op op) {
  work last;
  for (const auto& s : spans)
    last = splits(*this, s.size)
               ? issue_reduce_scatter(s.data, s.size / static_cast<std::size_t>(size()), op)
               : issue_all_reduce(s.data, s.size, op);
  return last;
}

work process_group::issue_all_gather_spans(const std::vector<float_span>& spans) {
  work last;
  for (const auto& s : spans)
    if (splits(*this, s.size))
      last = issue_all_gather(s.data, s.size / static_cast<std::size_t>(size()));
  return last;
}

void require_device_reduce_op(reduce_op op, const char* collective) {
  if (op == reduce_op::sum || op == reduce_op::mean) return;
  throw device_error(std::string("device collectives: ") + collective + " (" + reduce_op_name(op) +
                     "): device collectives reduce by sum or mean only; min and max need the "
                     "reducer actors (ring, tree, reduce_to_one)");
}

std::shared_ptr<group_rendezvous> make_device_rendezvous(int size, const device_spec& spec) {
  switch (spec.kind) {
    case device_spec::kind_t::cpu:
    case device_spec::kind_t::sim:
      return make_host_rendezvous(size, spec.kind);
    case device_spec::kind_t::cuda:
      if (!built_with_nccl())
        throw device_error(std::string("device collectives on ") + spec.str() + ": " + no_nccl);
      return make_nccl_rendezvous(size);
  }
  throw device_error("device collectives: unknown device kind for " + spec.str());
}

#ifndef TROUPE_HAVE_NCCL
bool built_with_nccl() noexcept {
  return false;
}
std::shared_ptr<group_rendezvous> make_nccl_rendezvous(int) {
  throw device_error(no_nccl);
}
std::shared_ptr<group_rendezvous> make_nccl_rendezvous(int, nccl_unique_id) {
  throw device_error(no_nccl);
}
nccl_unique_id nccl_group_id(const group_rendezvous&) {
  throw device_error(no_nccl);
}
#endif

}  // namespace troupe
