// Partitioners: every kind places (and splits) exactly as documented in
// actors/partitioner.hpp, greedy placement balances bytes, a split variable
// joins back bit-equal, and bad configurations name the field.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/partitioner.hpp"

using namespace troupe;

namespace {

// The MLP 784-256-256-10 in the models' variable order.
std::vector<variable_desc> mlp_vars() {
  return {{"dense_0/kernel", {784, 256}}, {"dense_0/bias", {256}},
          {"dense_1/kernel", {256, 256}}, {"dense_1/bias", {256}},
          {"dense_2/kernel", {256, 10}},  {"dense_2/bias", {10}}};
}

partitioner_config kind(const std::string& k) {
  partitioner_config c;
  c.kind = k;
  return c;
}

struct expect_piece {
  std::string variable;
  int64_t shard, begin, end;
  std::string name;
};

void check(const placement& p, const std::vector<expect_piece>& want) {
  REQUIRE(p.size() == want.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    CAPTURE(i);
    CHECK(p[i].variable == want[i].variable);
    CHECK(p[i].shard == want[i].shard);
    CHECK(p[i].row_begin == want[i].begin);
    CHECK(p[i].row_end == want[i].end);
    CHECK(p[i].piece_name == want[i].name);
  }
}

std::vector<int64_t> shard_loads(const placement& p, const std::vector<variable_desc>& vars,
                                 int64_t shards) {
  std::vector<int64_t> load(static_cast<std::size_t>(shards), 0);
  for (const auto& pc : p) {
    auto v = std::find_if(vars.begin(), vars.end(),
                          [&](const variable_desc& d) { return d.name == pc.variable; });
    load[static_cast<std::size_t>(pc.shard)] += piece_bytes(*v, pc.row_begin, pc.row_end);
  }
  return load;
}

tensor random_tensor(const shape_t& s, std::mt19937& g) {
  tensor t(s);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& x : t.span<float>()) x = d(g);
  return t;
}

std::string error_of(const std::vector<variable_desc>& vars, int64_t shards,
                     const partitioner_config& cfg) {
  try {
    (void)partition_variables(vars, shards, cfg);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("round_robin: variable i on shard i mod S, unsplit") {
  check(partition_variables(mlp_vars(), 2, kind("round_robin")),
        {{"dense_0/kernel", 0, 0, 784, "dense_0/kernel"},
         {"dense_0/bias", 1, 0, 256, "dense_0/bias"},
         {"dense_1/kernel", 0, 0, 256, "dense_1/kernel"},
         {"dense_1/bias", 1, 0, 256, "dense_1/bias"},
         {"dense_2/kernel", 0, 0, 256, "dense_2/kernel"},
         {"dense_2/bias", 1, 0, 10, "dense_2/bias"}});
  auto p4 = partition_variables(mlp_vars(), 4, kind("round_robin"));
  std::vector<int64_t> shards;
  for (const auto& pc : p4) shards.push_back(pc.shard);
  CHECK(shards == std::vector<int64_t>{0, 1, 2, 3, 0, 1});
  // The default config is round_robin.
  CHECK(partition_variables(mlp_vars(), 3, {})[4].shard == 1);
}

TEST_CASE("greedy_bytes: largest first onto the lightest shard, ties to the lowest") {
  // Bytes: k0 802816, k1 262144, k2 10240, b0 = b1 1024, b2 40. k0 fills
  // shard 0; everything else is lighter on shard 1.
  check(partition_variables(mlp_vars(), 2, kind("greedy_bytes")),
        {{"dense_0/kernel", 0, 0, 784, "dense_0/kernel"},
         {"dense_0/bias", 1, 0, 256, "dense_0/bias"},
         {"dense_1/kernel", 1, 0, 256, "dense_1/kernel"},
         {"dense_1/bias", 1, 0, 256, "dense_1/bias"},
         {"dense_2/kernel", 1, 0, 256, "dense_2/kernel"},
         {"dense_2/bias", 1, 0, 10, "dense_2/bias"}});
  // Equal sizes: earlier variable first, lowest shard first.
  std::vector<variable_desc> same{{"a", {10}}, {"b", {10}}, {"c", {10}}, {"d", {10}}};
  auto p = partition_variables(same, 3, kind("greedy_bytes"));
  std::vector<int64_t> shards;
  for (const auto& pc : p) shards.push_back(pc.shard);
  CHECK(shards == std::vector<int64_t>{0, 1, 2, 0});
  // More shards than variables: some shards stay empty, nothing breaks.
  CHECK(pieces_on_shard(partition_variables(same, 6, kind("greedy_bytes")), 5).empty());
}

TEST_CASE("greedy_bytes balances bytes: shard loads differ by at most the largest variable") {
  std::mt19937 g(11);
  std::uniform_int_distribution<int64_t> rows(1, 300), cols(1, 64);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<variable_desc> vars;
    for (int i = 0; i < 25; ++i) {
      std::string name = "v";  // not "v" + ...: GCC 12 -Wrestrict false positive
      name += std::to_string(i);
      vars.push_back({name, {rows(g), cols(g)}});
    }
    for (int64_t shards : {2, 3, 5}) {
      auto p = partition_variables(vars, shards, kind("greedy_bytes"));
      auto load = shard_loads(p, vars, shards);
      int64_t largest = 0;
      for (const auto& v : vars) largest = std::max(largest, piece_bytes(v, 0, v.shape[0]));
      auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      CHECK(*hi - *lo <= largest);
      int64_t total = 0;
      for (auto l : load) total += l;
      CHECK(*hi <= total / shards + largest);
    }
  }
}

TEST_CASE("fixed_shards: near-equal row ranges over consecutive shards") {
  check(partition_variables(mlp_vars(), 2, kind("fixed_shards")),
        {{"dense_0/kernel", 0, 0, 392, "dense_0/kernel/part0"},
         {"dense_0/kernel", 1, 392, 784, "dense_0/kernel/part1"},
         {"dense_0/bias", 0, 0, 128, "dense_0/bias/part0"},
         {"dense_0/bias", 1, 128, 256, "dense_0/bias/part1"},
         {"dense_1/kernel", 0, 0, 128, "dense_1/kernel/part0"},
         {"dense_1/kernel", 1, 128, 256, "dense_1/kernel/part1"},
         {"dense_1/bias", 0, 0, 128, "dense_1/bias/part0"},
         {"dense_1/bias", 1, 128, 256, "dense_1/bias/part1"},
         {"dense_2/kernel", 0, 0, 128, "dense_2/kernel/part0"},
         {"dense_2/kernel", 1, 128, 256, "dense_2/kernel/part1"},
         {"dense_2/bias", 0, 0, 5, "dense_2/bias/part0"},
         {"dense_2/bias", 1, 5, 10, "dense_2/bias/part1"}});
  // 10 rows in 3: 4, 3, 3 (the first rows % n one longer); one row is never
  // split; 2 rows give 2 pieces; a scalar is one piece. Shards continue
  // from variable to variable.
  std::vector<variable_desc> vars{{"a", {10, 4}}, {"b", {1, 4}}, {"c", {2}}, {"d", {}}};
  auto cfg = kind("fixed_shards");
  cfg.fixed_shards = 3;
  check(partition_variables(vars, 3, cfg), {{"a", 0, 0, 4, "a/part0"},
                                            {"a", 1, 4, 7, "a/part1"},
                                            {"a", 2, 7, 10, "a/part2"},
                                            {"b", 0, 0, 1, "b"},
                                            {"c", 1, 0, 1, "c/part0"},
                                            {"c", 2, 1, 2, "c/part1"},
                                            {"d", 0, 0, 1, "d"}});
  // More pieces than shards wrap around; fixed_shards = 1 splits nothing.
  cfg.fixed_shards = 3;
  auto wrapped = partition_variables({{"a", {9}}}, 2, cfg);
  REQUIRE(wrapped.size() == 3);
  CHECK(wrapped[2].shard == 0);
  CHECK(wrapped[2].row_begin == 6);
  cfg.fixed_shards = 1;
  check(partition_variables({{"a", {9}}, {"b", {4}}}, 2, cfg),
        {{"a", 0, 0, 9, "a"}, {"b", 1, 0, 4, "b"}});
}

TEST_CASE("min_max_bytes: split above max_shard_bytes, never below min_slice_bytes") {
  // a: 100 rows x 1024 B = 102400 B; ceil(102400 / 30000) = 4 pieces of 25
  // rows; b (40 B) stays whole. Greedy: a's 4 equal pieces take shards 0, 1,
  // 2, 0; b goes to the lightest, shard 1.
  std::vector<variable_desc> vars{{"a", {100, 256}}, {"b", {10}}};
  auto cfg = kind("min_max_bytes");
  cfg.max_shard_bytes = 30000;
  cfg.min_slice_bytes = 0;
  check(partition_variables(vars, 3, cfg), {{"a", 0, 0, 25, "a/part0"},
                                            {"a", 1, 25, 50, "a/part1"},
                                            {"a", 2, 50, 75, "a/part2"},
                                            {"a", 0, 75, 100, "a/part3"},
                                            {"b", 1, 0, 10, "b"}});
  // 3 pieces would be 33 rows = 33792 B < 40000: only 2 (50 rows = 51200 B).
  cfg.min_slice_bytes = 40000;
  check(partition_variables(vars, 3, cfg),
        {{"a", 0, 0, 50, "a/part0"}, {"a", 1, 50, 100, "a/part1"}, {"b", 2, 0, 10, "b"}});
  // A minimum above the whole variable keeps it whole.
  cfg.min_slice_bytes = 256 << 10;
  check(partition_variables(vars, 3, cfg), {{"a", 0, 0, 100, "a"}, {"b", 1, 0, 10, "b"}});
  // Never more pieces than rows.
  cfg.min_slice_bytes = 0;
  cfg.max_shard_bytes = 100000;
  auto wide = partition_variables({{"w", {3, 100000}}}, 2, cfg);
  REQUIRE(wide.size() == 3);
  CHECK(wide[2].piece_name == "w/part2");
  // Not above the maximum: unsplit.
  cfg.max_shard_bytes = 102400;
  CHECK(partition_variables(vars, 2, cfg).size() == 2);
  // The MLP with 256 KiB pieces at most: dense_0/kernel (784 KiB) in 4,
  // dense_1/kernel (256 KiB) whole.
  cfg.max_shard_bytes = 256 << 10;
  cfg.min_slice_bytes = 64 << 10;
  auto mlp = partition_variables(mlp_vars(), 2, cfg);
  CHECK(pieces_of(mlp, "dense_0/kernel").size() == 4);
  CHECK(pieces_of(mlp, "dense_1/kernel").size() == 1);
  CHECK(pieces_of(mlp, "dense_0/kernel")[3].row_end == 784);
}

TEST_CASE("split_rows and join_rows round-trip bit-equal") {
  std::mt19937 g(5);
  auto t = random_tensor({7, 3}, g);
  auto cfg = kind("fixed_shards");
  cfg.fixed_shards = 3;
  auto p = partition_variables({{"t", {7, 3}}}, 2, cfg);
  auto parts = split_rows(t, p);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == shape_t{3, 3});
  CHECK(parts[1].shape() == shape_t{2, 3});
  CHECK(parts[1].f32()[0] == t.f32()[9]);
  CHECK_FALSE(parts[0].shares_buffer_with(t));
  CHECK(join_rows(parts) == t);

  // int32 and a scalar go through unchanged.
  auto ints = tensor::from<int32_t>({5}, {1, -2, 3, -4, 5});
  auto pi = partition_variables({{"i", {5}, dtype::i32}}, 2, kind("fixed_shards"));
  CHECK(join_rows(split_rows(ints, pi)) == ints);
  auto scalar = tensor::from<float>({}, {2.5f});
  auto ps = partition_variables({{"s", {}}}, 2, kind("fixed_shards"));
  CHECK(join_rows(split_rows(scalar, ps)) == scalar);

  CHECK_THROWS_AS(split_rows(t, {{"t", 0, 5, 8, "t/part9"}}), std::invalid_argument);
  CHECK_THROWS_AS(join_rows({tensor({2, 3}), tensor({2, 4})}), std::invalid_argument);
  CHECK_THROWS_AS(join_rows({}), std::invalid_argument);
}

TEST_CASE("split_for_shards and join_pieces: the whole model back, for every kind") {
  std::mt19937 g(9);
  std::vector<named_tensor> vars;
  for (const auto& d : mlp_vars()) vars.push_back({d.name, random_tensor(d.shape, g)});
  for (const auto& k : partitioner_kinds()) {
    CAPTURE(k);
    auto cfg = kind(k);
    cfg.max_shard_bytes = 100000;
    cfg.min_slice_bytes = 1000;
    auto p = partition_variables(mlp_vars(), 2, cfg);
    auto by_shard = split_for_shards(vars, p, 2);
    std::size_t pieces = 0;
    std::vector<named_tensor> all;
    // Pieces from the last shard first: order must not matter.
    for (auto s = by_shard.rbegin(); s != by_shard.rend(); ++s) {
      pieces += s->size();
      all.insert(all.end(), s->begin(), s->end());
    }
    CHECK(pieces == p.size());
    auto back = join_pieces(all, p);
    REQUIRE(back.size() == vars.size());
    for (std::size_t i = 0; i < vars.size(); ++i) {
      CHECK(back[i].name == vars[i].name);
      CHECK(back[i].value == vars[i].value);
    }
    all.pop_back();
    CHECK_THROWS_WITH_AS(join_pieces(all, p), doctest::Contains("missing piece"),
                         std::invalid_argument);
  }
}

TEST_CASE("bad configurations name the field") {
  auto vars = mlp_vars();
  CHECK(error_of(vars, 2, kind("x")) ==
        "strategy.partitioner.kind: unknown partitioner 'x' (known: round_robin, greedy_bytes, "
        "fixed_shards, min_max_bytes)");
  CHECK(error_of(vars, 0, {}) == "strategy.shards: expected an integer >= 1, got 0");
  CHECK(
      error_of(vars, 2, kind("min_max_bytes")).starts_with("strategy.partitioner.max_shard_bytes"));
  auto neg = kind("fixed_shards");
  neg.fixed_shards = -1;
  CHECK(error_of(vars, 2, neg).starts_with("strategy.partitioner.fixed_shards"));
  auto neg_slice = kind("min_max_bytes");
  neg_slice.max_shard_bytes = 10;
  neg_slice.min_slice_bytes = -1;
  CHECK(error_of(vars, 2, neg_slice).starts_with("strategy.partitioner.min_slice_bytes"));
  CHECK(error_of({{"a", {2}}, {"a", {3}}}, 2, {}).find("'a' appears twice") != std::string::npos);
  CHECK_THROWS_AS(split_for_shards({}, {{"a", 0, 0, 1, "a"}}, 1), std::invalid_argument);
}
