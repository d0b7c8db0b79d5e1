#pragma once
// Partitioners: where each variable of a model lives when the variables are
// spread over S variable shards (parameter_server, central_storage). Pure
// functions, no actors: the coordinator computes a placement once, spawns the
// shards with their pieces, and replicas split/join tensors with it.
//
// A piece is the rows [row_begin, row_end) of a variable along its first
// dimension. An unsplit variable is one piece named as the variable; the
// pieces of a split variable are named "<var>/part<k>". Checkpoints hold whole
// variables (join_pieces), never pieces, so a job saved with one placement
// resumes with any other strategy.
#include <cstdint>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "messages/messages.hpp"

namespace troupe {

// A variable as partitioners see it (no data needed).
struct variable_desc {
  std::string name;
  shape_t shape;
  dtype type = dtype::f32;
};

struct variable_piece {
  std::string variable;
  int64_t shard = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  std::string piece_name;
};

// In variable order, and within a variable in row order.
using placement = std::vector<variable_piece>;

// partitioner_config (strategy.partitioner) lives in config/job_config.hpp.

// The kinds partition_variables() knows, in the order error messages list them.
const std::vector<std::string>& partitioner_kinds();

// Places `vars` over `shards` shards:
// - round_robin: variable i on shard i mod S, unsplit.
// - greedy_bytes: largest variable first onto the shard holding the fewest
//   bytes so far (ties: the earlier variable first, the lowest shard), unsplit.
// - fixed_shards: every variable with >= 2 rows split into min(n, rows)
//   pieces (n = fixed_shards, or S when 0) of near-equal rows, the first
//   rows % n pieces one row longer (TF FixedShardsPartitioner); pieces, and
//   unsplit variables, go to consecutive shards, continuing from variable to
//   variable (piece j of the whole placement on shard j mod S).
// - min_max_bytes: a variable of more than max_shard_bytes is split into
//   ceil(bytes / max_shard_bytes) near-equal pieces, fewer if a piece would be
//   smaller than min_slice_bytes (never more than its rows); then all pieces
//   are placed as in greedy_bytes (TF MinSize/MaxSize partitioners).
// Throws std::invalid_argument naming the config field
// ("strategy.partitioner.kind: unknown partitioner 'x' (known: ...)",
// "strategy.shards: ...") for S < 1, an unknown kind, negative sizes,
// min_max_bytes without max_shard_bytes > 0, or duplicate variable names.
placement partition_variables(const std::vector<variable_desc>& vars, int64_t shards,
                              const partitioner_config& cfg);

// Rows of a variable along its first dimension (a scalar counts as 1 row).
int64_t variable_rows(const shape_t& shape);
// Bytes of one piece (rows [row_begin, row_end) of a variable of this shape).
int64_t piece_bytes(const variable_desc& v, int64_t row_begin, int64_t row_end);

// The pieces that live on `shard`, in placement order.
placement pieces_on_shard(const placement& p, int64_t shard);
// The pieces of `variable`, in row order (empty when it is not placed).
placement pieces_of(const placement& p, const std::string& variable);
// The shape of a piece of a variable of shape `whole`.
shape_t piece_shape(const shape_t& whole, const variable_piece& piece);

// Copies of the rows of `value` that `pieces` (one variable's, from
// pieces_of) describe, in that order. Throws std::invalid_argument when a
// range is outside the tensor.
std::vector<tensor> split_rows(const tensor& value, const placement& pieces);
// The inverse: the pieces concatenated along the first dimension (a new
// tensor). Throws std::invalid_argument when types or trailing dims differ.
tensor join_rows(const std::vector<tensor>& pieces);

// Every variable split into its pieces and grouped by shard: result[s] holds
// shard s's pieces, named by piece_name, in placement order. Throws
// std::invalid_argument for a placed variable missing from `vars` or a shape
// the placement does not fit.
std::vector<std::vector<named_tensor>> split_for_shards(const std::vector<named_tensor>& vars,
                                                        const placement& p, int64_t shards);
// The whole variables back from pieces named by piece_name (any order, from
// any number of shards), in the placement's variable order. Throws
// std::invalid_argument naming a missing piece.
std::vector<named_tensor> join_pieces(const std::vector<named_tensor>& pieces, const placement& p);

// A whole model state from the shards' states: variables joined from their
// pieces, and slots "<piece>/<suffix>" joined into "<var>/<suffix>" for each
// of `slot_suffixes` (the optimizer's slot_names()); other entries (such as
// "optimizer/step") are taken from shard 0. Throws std::invalid_argument
// naming a missing piece or slot.
model_state join_shard_states(const std::vector<shard_state>& states, const placement& p,
                              const std::vector<std::string>& slot_suffixes);
// The inverse, for restoring: shard s gets its pieces and their slots, the
// other entries, and `version`. Throws std::invalid_argument naming a
// variable or slot the state lacks.
std::vector<shard_state> split_model_state(const model_state& ms, const placement& p,
                                           int64_t shards,
                                           const std::vector<std::string>& slot_suffixes,
                                           int64_t version);

}  // namespace troupe
