#pragma once
// Reducers: one actor per replica, all-reducing (and broadcasting) tensors in
// place across the group inside one process, with the algorithm chosen by
// name (actors/reducers/: ring, tree, reduce_to_one).
//
// Usage: auto group = spawn_reducer_group(sys, n, cfg); then per step every
// rank i sends `allreduce_atom, reduce_op::mean, grads_i` to group[i] and gets
// the same tensors back, holding the mean over the group. Ranks may call at
// different times; each rank's collectives are matched by their order. Keep
// every handle of the group alive while using it (the reducers hold only weak
// references to each other, so dropping all handles ends the group).
#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "messages/protocols.hpp"

namespace troupe {

struct job_config;

// reduce_op and reduce_op_name() live in messages/messages.hpp (the protocol
// needs them).

struct reducer_config {
  std::string algorithm = "ring";  // "ring" | "tree" | "reduce_to_one"
  // Fuse many tensors into buckets of about this size (DDP buckets / Horovod
  // tensor fusion): one run of the algorithm per bucket, whatever the number
  // of tensors; no copy (the tensors are one virtual buffer).
  int64_t bucket_bytes = 4 << 20;
  int64_t chunk_bytes = 1 << 20;  // pipelining granularity inside the ring (and tree)
};

// The ranges [begin, end) of a collective's virtual buffer (its tensors
// concatenated, `numel` floats) that rank `rank` of `n` holds reduced after a
// reduce_scatter and contributes to an all_gather. Over all ranks they cover
// [0, numel) exactly once. Throws std::invalid_argument for a bad rank.
std::vector<std::pair<int64_t, int64_t>> reduce_scatter_segments(int64_t numel,
                                                                 const reducer_config& cfg, int n,
                                                                 int rank);

// The algorithm names spawn_reducer_group() knows.
const std::vector<std::string>& reducer_algorithms();

// Spawns n reducers wired to each other (rank i = element i). Throws
// std::invalid_argument for an unknown algorithm (naming the known ones),
// n < 1, or non-positive bucket/chunk sizes.
// The reducer settings of a job's config (strategy.reducer).
reducer_config reducer_config_of(const job_config& c);

std::vector<reducer_actor> spawn_reducer_group(caf::actor_system& sys, int n,
                                               const reducer_config& cfg);

}  // namespace troupe
