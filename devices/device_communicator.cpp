// make_device_collective_group: the group for a kind of device
// (devices/device_communicator.hpp); the reduce ops they all take; and the NCCL entry points of
// devices/nccl_id.hpp in a build without NCCL.
#include "devices/device_communicator.hpp"

#include "devices/host_communicator.hpp"
#include "devices/nccl_id.hpp"

namespace troupe {

namespace {
constexpr const char* no_nccl = "cuda devices need NCCL: this build has none";
}  // namespace

void require_device_reduce_op(reduce_op op, const char* collective) {
  if (op == reduce_op::sum || op == reduce_op::mean) return;
  throw device_error(std::string("device collectives: ") + collective + " (" + reduce_op_name(op) +
                     "): device collectives reduce by sum or mean only; min and max need the "
                     "reducer actors (ring, tree, reduce_to_one)");
}

std::shared_ptr<device_collective_group> make_device_collective_group(int size,
                                                                      const device_spec& spec) {
  switch (spec.kind) {
    case device_spec::kind_t::cpu:
    case device_spec::kind_t::sim:
      return make_host_collective_group(size, spec.kind);
    case device_spec::kind_t::cuda:
      if (!built_with_nccl())
        throw device_error(std::string("device collectives on ") + spec.str() + ": " + no_nccl);
      return make_nccl_group(size);
  }
  throw device_error("device collectives: unknown device kind for " + spec.str());
}

#ifndef TROUPE_HAVE_NCCL
bool built_with_nccl() noexcept {
  return false;
}
std::shared_ptr<device_collective_group> make_nccl_group(int) {
  throw device_error(no_nccl);
}
std::shared_ptr<device_collective_group> make_nccl_group(int, nccl_unique_id) {
  throw device_error(no_nccl);
}
nccl_unique_id nccl_group_id(const device_collective_group&) {
  throw device_error(no_nccl);
}
#endif

}  // namespace troupe
