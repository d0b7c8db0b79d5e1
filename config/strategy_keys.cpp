#include "config/strategy_keys.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>

namespace troupe {

using nlohmann::json;
using namespace json_read;

namespace {
const enum_names<reducer_algorithm> kAlgorithmNames = {
    {reducer_algorithm::ring, "ring"},
    {reducer_algorithm::tree, "tree"},
    {reducer_algorithm::reduce_to_one, "reduce_to_one"},
    {reducer_algorithm::device, "device"}};
const enum_names<reducer_transport> kTransportNames = {{reducer_transport::direct, "direct"},
                                                       {reducer_transport::actors, "actors"}};
const enum_names<wire_format> kWireNames = {{wire_format::fp32, "fp32"},
                                            {wire_format::bf16, "bf16"}};
const enum_names<same_host_link> kSameHostNames = {{same_host_link::shared_memory, "shm"},
                                                   {same_host_link::unix_socket, "unix"},
                                                   {same_host_link::tcp, "tcp"}};
}  // namespace

const char* name_of(reducer_transport t) {
  return name_in(kTransportNames, t);
}
const char* name_of(wire_format w) {
  return name_in(kWireNames, w);
}
const char* name_of(same_host_link l) {
  return name_in(kSameHostNames, l);
}

const char* name_of(reducer_algorithm a) {
  return name_in(kAlgorithmNames, a);
}

reducer_algorithm parse_reducer_algorithm(const std::string& name) {
  if (name == "nccl") return reducer_algorithm::device;  // the name it had until 2026-11
  for (const auto& [value, known] : kAlgorithmNames)
    if (name == known) return value;
  throw std::invalid_argument("unknown reducer algorithm \"" + name +
                              "\" (ring, tree, reduce_to_one, device)");
}

value_reader<int64_t> integer_at_least(int64_t min) {
  return [min](const json& v, const std::string& p) { return read_int(v, p, min); };
}

value_reader<int64_t> integer_in(int64_t min, int64_t max) {
  return [min, max](const json& v, const std::string& p) { return read_int_in(v, p, min, max); };
}

value_reader<double> number_in(range r) {
  return [r](const json& v, const std::string& p) { return read_number(v, p, r); };
}

value_reader<bool> boolean() {
  return [](const json& v, const std::string& p) { return read_bool(v, p); };
}

namespace strategy_keys {

namespace {
// One of `allowed`; "nccl" is read as "device" where that is allowed.
reducer_algorithm read_algorithm(const json& v, const std::string& path,
                                 const std::vector<reducer_algorithm>& allowed) {
  std::vector<std::string> names;
  for (auto a : allowed) names.push_back(name_of(a));
  const bool device =
      std::find(allowed.begin(), allowed.end(), reducer_algorithm::device) != allowed.end();
  if (device && v.is_string() && v.get_ref<const std::string&>() == "nccl") {
    // The former name: on cpu and sim devices these collectives are shared
    // memory, not NCCL. Old configs keep working; the log says what to write.
    spdlog::warn(
        "{}: \"nccl\" is the former name of \"device\" (the device collectives: "
        "NCCL on cuda devices, shared memory on cpu and sim); write \"device\"",
        path);
    return reducer_algorithm::device;
  }
  return parse_reducer_algorithm(read_enum(v, path, names));
}
}  // namespace

strategy_key replicas() {
  return {"replicas",
          [](const json& v, const std::string& p, strategy_config& s) {
            s.replicas_auto = v.is_string() && v.get_ref<const std::string&>() == "auto";
            if (s.replicas_auto) return;
            if (v.is_string()) expected(p, "an integer in [1, 65536] or \"auto\"", v);
            s.replicas = read_int_in(v, p, 1, 65536);
          },
          [](const strategy_config& s) { return json(s.replicas); }};
}

strategy_key steps_per_update() {
  return field_key("steps_per_update", &strategy_config::steps_per_update, integer_at_least(1));
}

strategy_key reducer(std::vector<reducer_algorithm> algorithms) {
  auto read = [algorithms](const json& j, const std::string& path, strategy_config& c) {
    auto& s = c.reducer;
    object_reader r(j, path,
                    {"algorithm", "bucket_bytes", "chunk_bytes", "hierarchical", "transport",
                     "wire", "same_host", "yield_us"});
    r.with("algorithm", [&](const json& v, const std::string& p) {
      s.algorithm = read_algorithm(v, p, algorithms);
    });
    r.with("bucket_bytes",
           [&](const json& v, const std::string& p) { s.bucket_bytes = read_int(v, p, 4); });
    r.with("chunk_bytes",
           [&](const json& v, const std::string& p) { s.chunk_bytes = read_int(v, p, 4); });
    r.with("hierarchical",
           [&](const json& v, const std::string& p) { s.hierarchical = read_bool(v, p); });
    r.with("transport", [&](const json& v, const std::string& p) {
      s.transport = read_named(v, p, kTransportNames);
    });
    r.with("wire",
           [&](const json& v, const std::string& p) { s.wire = read_named(v, p, kWireNames); });
    r.with("same_host", [&](const json& v, const std::string& p) {
      s.same_host = read_named(v, p, kSameHostNames);
    });
    r.with("yield_us",
           [&](const json& v, const std::string& p) { s.yield_us = read_int_in(v, p, 0, 100000); });
  };
  auto write = [](const strategy_config& c) {
    return json{
        {"algorithm", name_of(c.reducer.algorithm)}, {"bucket_bytes", c.reducer.bucket_bytes},
        {"chunk_bytes", c.reducer.chunk_bytes},      {"hierarchical", c.reducer.hierarchical},
        {"transport", name_of(c.reducer.transport)}, {"wire", name_of(c.reducer.wire)},
        {"same_host", name_of(c.reducer.same_host)}, {"yield_us", c.reducer.yield_us}};
  };
  return {"reducer", read, write};
}

namespace {

void read_partitioner(const json& j, const std::string& path, partitioner_config& c) {
  object_reader r(j, path, {"kind", "max_shard_bytes", "min_slice_bytes", "fixed_shards"});
  r.with("kind", [&](const json& v, const std::string& p) {
    c.kind = read_enum(v, p, {"round_robin", "greedy_bytes", "fixed_shards", "min_max_bytes"});
  });
  r.with("max_shard_bytes",
         [&](const json& v, const std::string& p) { c.max_shard_bytes = read_int(v, p, 0); });
  r.with("min_slice_bytes",
         [&](const json& v, const std::string& p) { c.min_slice_bytes = read_int(v, p, 1); });
  r.with("fixed_shards",
         [&](const json& v, const std::string& p) { c.fixed_shards = read_int(v, p, 0); });
  if (c.kind == "min_max_bytes" && c.max_shard_bytes <= 0)
    fail(r.path("max_shard_bytes"),
         "the min_max_bytes partitioner needs a size > 0 to split at, got " +
             std::to_string(c.max_shard_bytes));
}

}  // namespace

std::vector<strategy_key> variable_shards() {
  strategy_key partitioner{"partitioner",
                           [](const json& v, const std::string& p, strategy_config& s) {
                             read_partitioner(v, p, s.partitioner);
                           },
                           [](const strategy_config& s) {
                             return json{{"kind", s.partitioner.kind},
                                         {"max_shard_bytes", s.partitioner.max_shard_bytes},
                                         {"min_slice_bytes", s.partitioner.min_slice_bytes},
                                         {"fixed_shards", s.partitioner.fixed_shards}};
                           }};
  return {field_key("shards", &strategy_config::shards, integer_in(1, 65536)),
          std::move(partitioner)};
}

strategy_key max_staleness() {
  return field_key("max_staleness", &strategy_config::max_staleness, integer_at_least(-1));
}

strategy_key check_replicas_every() {
  return field_key("check_replicas_every", &strategy_config::check_replicas_every,
                   integer_at_least(-1));
}

}  // namespace strategy_keys
}  // namespace troupe
