#pragma once
// NCCL device collective groups (collectives/nccl_group.cpp) by their
// identity, for groups whose ranks live in several processes: the chief
// makes the group (make_nccl_rendezvous(size)), reads its id (nccl_group_id) and
// sends the 128 bytes to the other processes as a CAF message; each makes
// its own group object from them (make_nccl_rendezvous(size, id)) and joins its
// ranks. Free of nccl.h (and of CUDA), so actors and messages can use it in
// every build: without NCCL the functions throw device_error.
#include <array>
#include <memory>

#include "collectives/process_group.hpp"

namespace troupe {

// NCCL_UNIQUE_ID_BYTES bytes of an ncclUniqueId.
using nccl_unique_id = std::array<char, 128>;

// Whether this build has the NCCL path (TROUPE_HAVE_NCCL).
bool built_with_nccl() noexcept;

// A group of `size` ranks with a new id (ncclGetUniqueId: rank 0's process
// makes it; it opens a bootstrap socket there). Throws device_error naming
// the NCCL error, or saying this build has no NCCL.
std::shared_ptr<group_rendezvous> make_nccl_rendezvous(int size);
// A group of `size` ranks with the id another process made.
std::shared_ptr<group_rendezvous> make_nccl_rendezvous(int size, nccl_unique_id id);
// The id of a group made by make_nccl_rendezvous; throws device_error for any
// other group.
nccl_unique_id nccl_group_id(const group_rendezvous& g);

}  // namespace troupe
