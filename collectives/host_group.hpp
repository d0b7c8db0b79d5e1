#pragma once
// The in-process device collective group for cpu:N and sim:N devices
// (collectives/host_group.cpp): the contract of
// collectives/process_group.hpp in host memory, so that what a strategy
// does with device collectives runs in the CPU test suite. Every rank posts
// its buffer; once all have, each rank reduces its share of the elements
// across all ranks' buffers (in rank order 0..n-1, so every rank gets
// bit-identical results; mean is the sum times 1/n as a float) and writes
// the result to every rank. A plain call returns once every rank has done
// its share; an issued one (issue_*) at once, and complete() waits for all
// of them: a rank goes on computing while its peers catch up. Plain loops
// over the buffers: a host context's device memory is host-addressable.
#include <memory>

#include "collectives/process_group.hpp"

namespace troupe {

// `size` ranks whose contexts are all of `kind` (cpu or sim; join() refuses
// other contexts). Throws device_error for size < 1 or a cuda kind.
std::shared_ptr<group_rendezvous> make_host_rendezvous(int size, device_spec::kind_t kind);

}  // namespace troupe
