#include "actors/partitioner.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>

namespace troupe {

namespace {

std::string known_kinds() {
  std::string s;
  for (const auto& k : partitioner_kinds()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

void check_config(const std::vector<variable_desc>& vars, int64_t shards,
                  const partitioner_config& cfg) {
  const auto& kinds = partitioner_kinds();
  if (std::find(kinds.begin(), kinds.end(), cfg.kind) == kinds.end())
    throw std::invalid_argument("strategy.partitioner.kind: unknown partitioner '" + cfg.kind +
                                "' (known: " + known_kinds() + ")");
  if (shards < 1)
    throw std::invalid_argument("strategy.shards: expected an integer >= 1, got " +
                                std::to_string(shards));
  if (cfg.fixed_shards < 0)
    throw std::invalid_argument(
        "strategy.partitioner.fixed_shards: expected an integer >= 0 (0 = one piece per shard), "
        "got " +
        std::to_string(cfg.fixed_shards));
  if (cfg.min_slice_bytes < 0)
    throw std::invalid_argument("strategy.partitioner.min_slice_bytes: expected >= 0, got " +
                                std::to_string(cfg.min_slice_bytes));
  if (cfg.max_shard_bytes < 0 || (cfg.kind == "min_max_bytes" && cfg.max_shard_bytes == 0))
    throw std::invalid_argument(
        "strategy.partitioner.max_shard_bytes: expected an integer >= 1 for min_max_bytes, got " +
        std::to_string(cfg.max_shard_bytes));
  std::set<std::string> seen;
  for (const auto& v : vars) {
    if (!seen.insert(v.name).second)
      throw std::invalid_argument("partitioner: variable '" + v.name + "' appears twice");
    (void)shape_numel(v.shape);  // throws on a negative dimension
  }
}

int64_t var_bytes(const variable_desc& v) {
  return shape_numel(v.shape) * static_cast<int64_t>(dtype_size(v.type));
}

// n near-equal row ranges over `rows` rows; the first rows % n one row longer.
std::vector<std::pair<int64_t, int64_t>> near_equal(int64_t rows, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> r;
  const int64_t base = rows / n, extra = rows % n;
  int64_t at = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t len = base + (k < extra ? 1 : 0);
    r.emplace_back(at, at + len);
    at += len;
  }
  return r;
}

void add_pieces(placement& out, const variable_desc& v, int64_t n) {
  const int64_t rows = variable_rows(v.shape);
  if (n <= 1) {
    out.push_back({v.name, 0, 0, rows, v.name});
    return;
  }
  int64_t k = 0;
  for (auto [b, e] : near_equal(rows, n))
    out.push_back({v.name, 0, b, e, v.name + "/part" + std::to_string(k++)});
}

// Largest piece first onto the least-loaded shard; ties keep placement order
// and pick the lowest shard, so the result is deterministic.
void place_greedy(placement& p, const std::vector<variable_desc>& vars, int64_t shards) {
  std::map<std::string, const variable_desc*> by_name;
  for (const auto& v : vars) by_name[v.name] = &v;
  std::vector<int64_t> bytes(p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    bytes[i] = piece_bytes(*by_name.at(p[i].variable), p[i].row_begin, p[i].row_end);
  std::vector<std::size_t> order(p.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return bytes[a] > bytes[b]; });
  std::vector<int64_t> load(static_cast<std::size_t>(shards), 0);
  for (auto i : order) {
    auto s = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    p[i].shard = static_cast<int64_t>(s);
    load[s] += bytes[i];
  }
}

// Pieces for min_max_bytes: as many as max_shard_bytes asks for, as few as
// min_slice_bytes allows (the shortest piece, rows / n rows, must reach it).
int64_t min_max_pieces(const variable_desc& v, const partitioner_config& cfg) {
  const int64_t bytes = var_bytes(v);
  const int64_t rows = variable_rows(v.shape);
  if (bytes <= cfg.max_shard_bytes || rows < 2) return 1;
  const int64_t row_bytes = bytes / rows;
  int64_t n = std::min((bytes + cfg.max_shard_bytes - 1) / cfg.max_shard_bytes, rows);
  while (n > 1 && (rows / n) * row_bytes < cfg.min_slice_bytes) --n;
  return n;
}

}  // namespace

const std::vector<std::string>& partitioner_kinds() {
  static const std::vector<std::string> k{"round_robin", "greedy_bytes", "fixed_shards",
                                          "min_max_bytes"};
  return k;
}

int64_t variable_rows(const shape_t& shape) {
  return shape.empty() ? 1 : shape[0];
}

int64_t piece_bytes(const variable_desc& v, int64_t row_begin, int64_t row_end) {
  const int64_t rows = variable_rows(v.shape);
  if (rows == 0) return 0;
  return var_bytes(v) / rows * (row_end - row_begin);
}

placement partition_variables(const std::vector<variable_desc>& vars, int64_t shards,
                              const partitioner_config& cfg) {
  check_config(vars, shards, cfg);
  placement p;
  if (cfg.kind == "round_robin") {
    for (std::size_t i = 0; i < vars.size(); ++i) {
      add_pieces(p, vars[i], 1);
      p.back().shard = static_cast<int64_t>(i) % shards;
    }
  } else if (cfg.kind == "greedy_bytes") {
    for (const auto& v : vars) add_pieces(p, v, 1);
    place_greedy(p, vars, shards);
  } else if (cfg.kind == "fixed_shards") {
    const int64_t n = cfg.fixed_shards > 0 ? cfg.fixed_shards : shards;
    for (const auto& v : vars) {
      const int64_t rows = variable_rows(v.shape);
      add_pieces(p, v, rows >= 2 ? std::min(n, rows) : 1);
    }
    for (std::size_t j = 0; j < p.size(); ++j) p[j].shard = static_cast<int64_t>(j) % shards;
  } else {  // min_max_bytes
    for (const auto& v : vars) add_pieces(p, v, min_max_pieces(v, cfg));
    place_greedy(p, vars, shards);
  }
  return p;
}

placement pieces_on_shard(const placement& p, int64_t shard) {
  placement r;
  for (const auto& x : p)
    if (x.shard == shard) r.push_back(x);
  return r;
}

placement pieces_of(const placement& p, const std::string& variable) {
  placement r;
  for (const auto& x : p)
    if (x.variable == variable) r.push_back(x);
  std::stable_sort(r.begin(), r.end(), [](const variable_piece& a, const variable_piece& b) {
    return a.row_begin < b.row_begin;
  });
  return r;
}

shape_t piece_shape(const shape_t& whole, const variable_piece& piece) {
  if (whole.empty()) return whole;
  shape_t s = whole;
  s[0] = piece.row_end - piece.row_begin;
  return s;
}

std::vector<tensor> split_rows(const tensor& value, const placement& pieces) {
  const int64_t rows = variable_rows(value.shape());
  const std::size_t row_bytes = rows ? value.nbytes() / static_cast<std::size_t>(rows) : 0;
  std::vector<tensor> out;
  out.reserve(pieces.size());
  for (const auto& pc : pieces) {
    if (pc.row_begin < 0 || pc.row_end < pc.row_begin || pc.row_end > rows)
      throw std::invalid_argument("split_rows: piece '" + pc.piece_name + "' rows [" +
                                  std::to_string(pc.row_begin) + ", " + std::to_string(pc.row_end) +
                                  ") outside a tensor of shape " + shape_string(value.shape()));
    tensor t(piece_shape(value.shape(), pc), value.type());
    if (t.nbytes())
      std::memcpy(t.raw(),
                  static_cast<const char*>(value.raw()) +
                      static_cast<std::size_t>(pc.row_begin) * row_bytes,
                  t.nbytes());
    out.push_back(std::move(t));
  }
  return out;
}

tensor join_rows(const std::vector<tensor>& pieces) {
  if (pieces.empty()) throw std::invalid_argument("join_rows: no pieces");
  const auto& first = pieces.front();
  if (first.rank() == 0) {
    if (pieces.size() != 1) throw std::invalid_argument("join_rows: several pieces of a scalar");
    return first.clone();
  }
  shape_t shape = first.shape();
  shape[0] = 0;
  for (const auto& t : pieces) {
    if (t.type() != first.type() || t.rank() != first.rank() ||
        !std::equal(t.shape().begin() + 1, t.shape().end(), first.shape().begin() + 1))
      throw std::invalid_argument("join_rows: piece " + std::string(dtype_name(t.type())) +
                                  shape_string(t.shape()) + " does not fit " +
                                  dtype_name(first.type()) + shape_string(first.shape()));
    shape[0] += t.dim(0);
  }
  tensor whole(shape, first.type());
  auto* dst = static_cast<char*>(whole.raw());
  for (const auto& t : pieces) {
    if (t.nbytes()) std::memcpy(dst, t.raw(), t.nbytes());
    dst += t.nbytes();
  }
  return whole;
}

std::vector<std::vector<named_tensor>> split_for_shards(const std::vector<named_tensor>& vars,
                                                        const placement& p, int64_t shards) {
  std::map<std::string, const tensor*> by_name;
  for (const auto& v : vars) by_name[v.name] = &v.value;
  std::vector<std::vector<named_tensor>> out(static_cast<std::size_t>(shards));
  for (const auto& pc : p) {
    auto it = by_name.find(pc.variable);
    if (it == by_name.end())
      throw std::invalid_argument("split_for_shards: no variable '" + pc.variable + "'");
    if (pc.shard < 0 || pc.shard >= shards)
      throw std::invalid_argument("split_for_shards: piece '" + pc.piece_name + "' on shard " +
                                  std::to_string(pc.shard) + " of " + std::to_string(shards));
    auto t = split_rows(*it->second, {pc});
    out[static_cast<std::size_t>(pc.shard)].push_back({pc.piece_name, std::move(t.front())});
  }
  return out;
}

std::vector<named_tensor> join_pieces(const std::vector<named_tensor>& pieces, const placement& p) {
  std::map<std::string, const tensor*> by_name;
  for (const auto& x : pieces) by_name[x.name] = &x.value;
  std::vector<named_tensor> out;
  std::set<std::string> done;
  for (const auto& pc : p) {
    if (!done.insert(pc.variable).second) continue;
    std::vector<tensor> parts;
    for (const auto& q : pieces_of(p, pc.variable)) {
      auto it = by_name.find(q.piece_name);
      if (it == by_name.end())
        throw std::invalid_argument("join_pieces: missing piece '" + q.piece_name +
                                    "' of variable '" + q.variable + "'");
      parts.push_back(*it->second);
    }
    out.push_back({pc.variable, join_rows(parts)});
  }
  return out;
}

namespace {

// Entries of `all` whose name is "<prefix>/<suffix>" for a piece, by piece.
std::vector<named_tensor> with_suffix(const std::vector<named_tensor>& all, const placement& p,
                                      const std::string& suffix, bool rename_to_piece) {
  std::map<std::string, const tensor*> by_name;
  for (const auto& t : all) by_name[t.name] = &t.value;
  std::vector<named_tensor> out;
  for (const auto& piece : p) {
    auto i = by_name.find(piece.piece_name + "/" + suffix);
    if (i == by_name.end())
      throw std::invalid_argument("slot '" + piece.piece_name + "/" + suffix + "' is missing");
    out.push_back({rename_to_piece ? piece.piece_name : i->first, *i->second});
  }
  return out;
}

bool is_slot_of_a_piece(const std::string& name, const placement& p,
                        const std::vector<std::string>& suffixes) {
  for (const auto& piece : p)
    for (const auto& s : suffixes)
      if (name == piece.piece_name + "/" + s) return true;
  return false;
}

bool is_slot_of_a_variable(const std::string& name, const placement& p,
                           const std::vector<std::string>& suffixes) {
  for (const auto& piece : p)
    for (const auto& s : suffixes)
      if (name == piece.variable + "/" + s) return true;
  return false;
}

}  // namespace

model_state join_shard_states(const std::vector<shard_state>& states, const placement& p,
                              const std::vector<std::string>& slot_suffixes) {
  std::vector<named_tensor> pieces, slots;
  for (const auto& s : states) {
    pieces.insert(pieces.end(), s.variables.begin(), s.variables.end());
    slots.insert(slots.end(), s.slots.begin(), s.slots.end());
  }
  model_state ms;
  ms.variables = join_pieces(pieces, p);
  for (const auto& suffix : slot_suffixes) {
    auto joined = join_pieces(with_suffix(slots, p, suffix, true), p);
    for (auto& t : joined) ms.slots.push_back({t.name + "/" + suffix, std::move(t.value)});
  }
  if (!states.empty())
    for (const auto& t : states.front().slots)
      if (!is_slot_of_a_piece(t.name, p, slot_suffixes)) ms.slots.push_back(t);
  return ms;
}

std::vector<shard_state> split_model_state(const model_state& ms, const placement& p,
                                           int64_t shards,
                                           const std::vector<std::string>& slot_suffixes,
                                           int64_t version) {
  std::vector<shard_state> out(static_cast<std::size_t>(shards));
  auto vars = split_for_shards(ms.variables, p, shards);
  for (int64_t s = 0; s < shards; ++s) {
    out[static_cast<std::size_t>(s)].variables = std::move(vars[static_cast<std::size_t>(s)]);
    out[static_cast<std::size_t>(s)].version = version;
  }
  for (const auto& suffix : slot_suffixes) {
    // The slots of every variable, named as the variables, split like them.
    std::vector<named_tensor> as_vars;
    std::map<std::string, const tensor*> by_name;
    for (const auto& t : ms.slots) by_name[t.name] = &t.value;
    for (const auto& piece : p) {
      if (!as_vars.empty() && as_vars.back().name == piece.variable) continue;
      auto i = by_name.find(piece.variable + "/" + suffix);
      if (i == by_name.end())
        throw std::invalid_argument("optimizer slot '" + piece.variable + "/" + suffix +
                                    "' is missing");
      as_vars.push_back({piece.variable, *i->second});
    }
    auto split = split_for_shards(as_vars, p, shards);
    for (int64_t s = 0; s < shards; ++s)
      for (auto& t : split[static_cast<std::size_t>(s)])
        out[static_cast<std::size_t>(s)].slots.push_back(
            {t.name + "/" + suffix, std::move(t.value)});
  }
  for (const auto& t : ms.slots)
    if (!is_slot_of_a_variable(t.name, p, slot_suffixes))
      for (auto& s : out) s.slots.push_back(t);
  return out;
}

}  // namespace troupe
