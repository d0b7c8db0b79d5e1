// The device path on the CPU: the caching allocator's bookkeeping, the
// device contexts (cpu:N shares host memory; sim:N has memory of its own, a
// copy thread and events), the model and optimizer computing in device
// memory, and every classifier strategy on sim devices, where a missed copy
// between host and device changes the result: each must train exactly what
// it trains on cpu devices.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "actors/fault_injection.hpp"
#include "collectives/nccl_id.hpp"
#include "config/job_config.hpp"
#include "devices/caching_allocator.hpp"
#include "devices/device_context.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"
#include "models/random.hpp"
#include "runtime/job.hpp"
#include "strategies/strategy.hpp"
#include "tests/captured_log.hpp"
#include "tests/device_fixtures.hpp"
#include "tests/skip.hpp"
#include "tests/strategy_fixtures.hpp"

using namespace troupe;
using namespace troupe::test;

TEST_CASE("caching_allocator: size classes, reuse without raw allocations, statistics") {
  int raw = 0, freed = 0;
  caching_allocator a(
      "test:0",
      [&](std::size_t n) {
        ++raw;
        return std::malloc(n);
      },
      [&](void* p) {
        ++freed;
        std::free(p);
      });
  CHECK(caching_allocator::size_class(0) == 512);
  CHECK(caching_allocator::size_class(513) == 1024);
  CHECK(caching_allocator::size_class((1 << 20) + 1) == (1 << 20) + (1 << 18));
  CHECK(caching_allocator::size_class(3 << 20) == 3 << 20);
  void* p = a.allocate(1000);
  void* q = a.allocate(1000);
  CHECK(p != q);
  CHECK(a.statistics().bytes_in_use == 2048);
  a.deallocate(p);
  CHECK(a.statistics().bytes_cached == 1024);
  // A warm step: the same sizes again come from the cache.
  for (int i = 0; i < 100; ++i) a.deallocate(a.allocate(900));
  auto s = a.statistics();
  CHECK(raw == 2);
  CHECK(s.raw_allocations == 2);
  CHECK(s.cache_hits == 100);
  CHECK(s.requests == 102);
  CHECK(s.peak_bytes_in_use == 2048);
  int local = 0;
  CHECK_THROWS_AS(a.deallocate(&local), std::logic_error);
  a.deallocate(q);
  a.release_cached();
  CHECK(freed == 2);
  CHECK(a.statistics().bytes_cached == 0);
}

TEST_CASE(
    "caching_allocator: a failed raw allocation releases the cache, retries, then names the size") {
  std::size_t budget = 4096, used = 0;
  std::map<void*, std::size_t> sizes;
  caching_allocator a(
      "cuda:7",
      [&](std::size_t n) -> void* {
        if (used + n > budget) return nullptr;
        used += n;
        void* p = std::malloc(n);
        sizes[p] = n;
        return p;
      },
      [&](void* p) {
        used -= sizes[p];
        std::free(p);
      });
  void* p = a.allocate(3000);
  a.deallocate(p);               // 3072 cached, counted against the budget
  void* big = a.allocate(4000);  // fits only once the cache is given back
  CHECK(big != nullptr);
  used = budget;
  CHECK_THROWS_WITH_AS(a.allocate(2 << 20),
                       doctest::Contains("cuda:7: out of memory allocating 2.0 MiB"),
                       std::runtime_error);
  a.deallocate(big);
}

TEST_CASE("device contexts: cpu shares host memory; sim has its own, counted, NaN until written") {
  auto cpu = make_device_context(parse_device("cpu:0"));
  CHECK(cpu->shares_host_memory());
  auto sim = make_device_context(parse_device("sim:1"));
  CHECK_FALSE(sim->shares_host_memory());
  CHECK(sim->spec().str() == "sim:1");
  auto b = sim->allocate(16 * sizeof(float));
  CHECK(std::isnan(b.f32()[3]));  // a read before any upload shows
  std::vector<float> host(16), back(16, 0.0f);
  for (int i = 0; i < 16; ++i) host[static_cast<std::size_t>(i)] = static_cast<float>(i) * 0.5f;
  sim->copy_to_device(b.data(), host.data(), 64);
  sim->copy_to_host(back.data(), b.data(), 64);
  CHECK(back == host);
  auto t = sim->transfers();
  CHECK(t.uploads == 1);
  CHECK(t.downloads == 1);
  CHECK(t.bytes_up == 64);
}

TEST_CASE(
    "sim: an async upload lands by the time its event is waited for, the source reusable at once") {
  auto sim = make_device_context(parse_device("sim:0"));
  const std::size_t n = 1 << 20;
  auto dst = sim->allocate(n * sizeof(float));
  std::vector<float> src(n, 1.5f);
  auto e = sim->upload_async(dst.data(), src.data(), n * sizeof(float));
  std::fill(src.begin(), src.end(), -1.0f);  // staged: the upload keeps 1.5
  sim->wait(e);
  CHECK(e->done());
  CHECK(dst.f32()[0] == 1.5f);
  CHECK(dst.f32()[n - 1] == 1.5f);
  // Buffers return to the allocator, and a second step allocates nothing new.
  auto raw = sim->memory_stats().raw_allocations;
  dst = device_buffer{};
  auto again = sim->allocate(n * sizeof(float));
  CHECK(sim->memory_stats().raw_allocations == raw);
  sim->synchronize();
}

namespace {
model_config mlp_config(const std::string& act) {
  model_config c;
  c.kind = "mlp";
  c.hidden = {12, 7};
  c.activation = act;
  return c;
}
std::pair<tensor, tensor> batch_of(int64_t b, int64_t f, int64_t classes, uint64_t seed) {
  splitmix64 g(seed);
  tensor x({b, f}), y({b}, dtype::i32);
  for (auto& v : x.span<float>()) v = static_cast<float>(g.normal());
  for (auto& v : y.span<int32_t>())
    v = static_cast<int32_t>(g.next() % static_cast<uint64_t>(classes));
  return {x, y};
}
}  // namespace

TEST_CASE(
    "an mlp on sim computes bit-identically to the host mlp, and only through explicit copies") {
  for (std::string act : {"relu", "tanh"}) {
    CAPTURE(act);
    auto host = create_model(mlp_config(act), {9, 4}, 3);
    auto sim = make_device_context(parse_device("sim:0"));
    auto dev = create_model_on(mlp_config(act), {9, 4}, 3, sim);
    CHECK_FALSE(host->device_resident());
    CHECK(dev->device_resident());
    auto hg = host->make_gradients();
    auto dg = dev->make_gradients();
    for (int m = 0; m < 3; ++m) {  // micro-batches accumulate
      auto [x, y] = batch_of(5 + m, 9, 4, 40 + static_cast<uint64_t>(m));
      auto a = host->train_batch(x, y, 0.1f, hg, m > 0);
      auto b = dev->train_batch(x, y, 0.1f, dg, m > 0);
      CHECK(a.loss_sum == b.loss_sum);
      CHECK(a.correct == b.correct);
    }
    // Not written by a resident model until asked for.
    CHECK(dg[0].value.span<float>()[0] == 0.0f);
    dev->gradients_to_host(dg);
    for (std::size_t i = 0; i < hg.size(); ++i) CHECK(hg[i].value == dg[i].value);

    // The optimizer on the device's pointers equals the host update.
    optimizer_config oc;
    oc.kind = "adam";
    oc.learning_rate = 0.01;
    kernels::optimizer ho(oc, 10), dopt(oc, 10);
    ho.init(host->variables());
    dopt.init(dev->variables());
    device_slots slots(*sim, *dev, 2);
    auto g = dev->device_gradients();
    for (int step = 0; step < 2; ++step) {
      ho.apply(host->variables(), hg);
      dopt.apply_on(sim->ops(), dev->device_variables(), {g.begin(), g.end()}, slots.ptrs);
    }
    CHECK(dopt.step() == 2);
    CHECK_FALSE(host->variables()[0].value == dev->variables()[0].value);  // staging is stale
    dev->variables_to_host();
    for (std::size_t i = 0; i < hg.size(); ++i)
      CHECK(host->variables()[i].value == dev->variables()[i].value);
    auto [x, y] = batch_of(2100, 9, 4, 99);  // evaluate crosses its 1024-row chunks
    auto eh = host->evaluate(x, y);
    auto ed = dev->evaluate(x, y);
    CHECK(eh.loss_sum == ed.loss_sum);
    CHECK(eh.correct == ed.correct);
    CHECK(ed.count == 2100);
    // A label out of range is refused on the host, naming it.
    tensor bad_y = y.clone();
    bad_y.data<int32_t>()[7] = 4;
    CHECK_THROWS_WITH(dev->train_batch(x, bad_y, 1.0f, dg, false),
                      doctest::Contains("label 4 at row 7"));
  }
}

TEST_CASE("a prefetched batch is uploaded ahead, and train_batch then copies nothing") {
  auto sim = make_device_context(parse_device("sim:0"));
  auto host = create_model(mlp_config("relu"), {9, 4}, 3);
  auto dev = create_model_on(mlp_config("relu"), {9, 4}, 3, sim);
  auto [x, y] = batch_of(6, 9, 4, 1);
  auto hg = host->make_gradients();
  auto dg = dev->make_gradients();
  const auto before = sim->transfers().bytes_up;
  dev->prefetch(x, y);
  CHECK(sim->transfers().bytes_up == before + x.nbytes() + y.nbytes());
  auto a = host->train_batch(x, y, 0.5f, hg, false);
  auto b = dev->train_batch(x, y, 0.5f, dg, false);
  CHECK(sim->transfers().bytes_up == before + x.nbytes() + y.nbytes());
  CHECK(a.loss_sum == b.loss_sum);
  dev->gradients_to_host(dg);
  for (std::size_t i = 0; i < hg.size(); ++i) CHECK(hg[i].value == dg[i].value);
  // Another batch of the same shape is not mistaken for the staged one.
  auto [x2, y2] = batch_of(6, 9, 4, 2);
  dev->prefetch(x, y);
  dev->train_batch(x2, y2, 0.5f, dg, false);
  host->train_batch(x2, y2, 0.5f, hg, false);
  dev->gradients_to_host(dg);
  for (std::size_t i = 0; i < hg.size(); ++i) CHECK(hg[i].value == dg[i].value);
}

TEST_CASE("a model kind without a device implementation is refused on a discrete device, named") {
  register_model("host_only_mlp", [](const model_config& c, const model_shape& s, uint64_t seed) {
    auto copy = c;
    copy.kind = "mlp";
    return create_model(copy, s, seed);
  });
  model_config c = mlp_config("relu");
  c.kind = "host_only_mlp";
  CHECK(create_model_on(c, {4, 2}, 1, make_device_context(parse_device("cpu:0"))) != nullptr);
  CHECK_THROWS_WITH(
      create_model_on(c, {4, 2}, 1, make_device_context(parse_device("sim:0"))),
      doctest::Contains("'host_only_mlp' has no device implementation, so it cannot run on sim:0"));
}

namespace {
// The same job on cpu devices and on sim devices.
std::vector<named_tensor> final_variables(job_config c, const std::string& kind) {
  for (auto& d : c.devices) d = kind + d.substr(d.find(':'));
  c.logging.output_dir += "-" + kind;
  return variables_of(run_job(c));
}
}  // namespace

TEST_CASE("every classifier strategy on sim devices trains bit-identically to cpu devices") {
  strategy_env env(400);
  struct variant {
    std::string kind, optimizer, algorithm;
    int64_t replicas;
  };
  for (const variant& v : std::vector<variant>{{"", "adam", "", 1},
                                               {"mirrored", "adam", "ring", 2},
                                               {"mirrored", "momentum", "device", 3},
                                               {"central_storage", "adam", "", 2},
                                               {"parameter_server", "sgd", "", 1},
                                               {"elastic_average", "adam", "", 2}}) {
    CAPTURE(v.kind);
    CAPTURE(v.algorithm);
    auto c = env.job(v.kind, v.optimizer, v.replicas, 48);
    c.training.max_steps = 9;
    c.training.eval_every_epochs = 1;  // evaluation installs variables on the device too
    if (!v.algorithm.empty()) c.strategy.reducer.algorithm = parse_reducer_algorithm(v.algorithm);
    if (v.kind == "mirrored") c.strategy.reducer.bucket_bytes = 4096;  // several buckets
    if (v.kind == "elastic_average") c.strategy.synchronous = true;
    if (v.kind == "parameter_server" || v.kind == "central_storage" || v.kind == "elastic_average")
      c.strategy.shards = 2;
    auto on_cpu = final_variables(c, "cpu");
    auto on_sim = final_variables(c, "sim");
    CHECK(max_abs_diff(on_cpu, on_sim) == 0.0);
  }
}

TEST_CASE("mirrored's device all-reduce (nccl on cuda, in-process on cpu/sim) equals the ring") {
  strategy_env env(400);
  auto c = env.job("mirrored", "adam", 2, 48);
  c.training.max_steps = 8;
  auto ring = variables_of(run_job(c));
  c.strategy.reducer.algorithm = reducer_algorithm::device;
  c.logging.output_dir += "-nccl";
  // Two ranks: a + b is the same float either way round.
  CHECK(max_abs_diff(ring, variables_of(run_job(c))) == 0.0);
}

TEST_CASE(
    "a replica failing in a device all-reduce step ends the job naming it; its peers are "
    "released") {
  strategy_env env(400);
  auto c = env.job("mirrored", "sgd", 3, 48);
  c.strategy.reducer.algorithm = reducer_algorithm::device;
  for (auto& d : c.devices) d = "sim" + d.substr(d.find(':'));
  job_options o;
  o.faults = inject_faults(fault_injection{}.fail_replica_at(1, 2));
  try {
    run_job(c, o);
    FAIL("the job should have failed");
  } catch (const job_error& e) {
    std::string w = e.what();
    CHECK(w.find("replica 1") != std::string::npos);
    CHECK(w.find("injected failure at step 2") != std::string::npos);
  }
}

TEST_CASE("config rules for discrete devices and the device all-reduce") {
  auto base =
      nlohmann::json::parse(R"({"name": "t", "strategy": {"kind": "mirrored", "replicas": 2},
                                        "devices": ["sim:0", "sim:1"]})");
  auto refused = [&](nlohmann::json patch, const std::string& what) {
    auto j = base;
    j.merge_patch(patch);
    CAPTURE(j.dump());
    CHECK_THROWS_WITH_AS(parse_job_config(j), doctest::Contains(what.c_str()), config_error);
  };
  CHECK_NOTHROW(parse_job_config(base));
  refused({{"strategy", {{"kind", "central_storage"}, {"reducer", {{"algorithm", "device"}}}}}},
          "strategy.reducer: the central_storage strategy does not use this key (a key of "
          "\"actor_learner\", \"mirrored\")");
  refused({{"strategy", {{"replicas", 3}, {"reducer", {{"algorithm", "device"}}}}}},
          "strategy.replicas: the device all-reduce needs one device per replica: 3 replicas on 2 "
          "devices");
  refused({{"strategy", {{"reducer", {{"wire", "bf16"}}}}}},
          "strategy.reducer.wire: \"bf16\" is for the direct links between processes");
  refused({{"strategy", {{"reducer", {{"algorithm", "device"}, {"wire", "half"}}}}}},
          "strategy.reducer.wire: expected one of");
  refused({{"strategy", {{"reducer", {{"algorithm", "ring"}, {"same_host", "tcp"}}}}}},
          "strategy.reducer.same_host: \"tcp\" is for the direct links between processes");
  refused({{"strategy", {{"reducer", {{"algorithm", "device"}, {"same_host", "pipe"}}}}}},
          "strategy.reducer.same_host: expected one of");
  refused({{"strategy", {{"reducer", {{"algorithm", "ring"}, {"yield_us", 500}}}}}},
          "strategy.reducer.yield_us: \"500\" is for the direct links between processes");
  refused({{"strategy", {{"reducer", {{"algorithm", "device"}, {"yield_us", -1}}}}}},
          "strategy.reducer.yield_us: expected an integer >= 0, got -1");
  auto yield = base;
  yield.merge_patch({{"strategy", {{"reducer", {{"algorithm", "device"}, {"yield_us", 0}}}}}});
  CHECK(parse_job_config(yield).strategy.reducer.yield_us == 0);
  CHECK(parse_job_config(base).strategy.reducer.yield_us == 3000);
  refused({{"strategy", {{"reducer", {{"algorithm", "gpu"}}}}}},
          "strategy.reducer.algorithm: expected one of \"ring\", \"tree\", \"reduce_to_one\", "
          "\"device\", got \"gpu\"");
  auto tcp = base;
  tcp.merge_patch({{"strategy", {{"reducer", {{"algorithm", "device"}, {"same_host", "tcp"}}}}}});
  CHECK(parse_job_config(tcp).strategy.reducer.same_host == same_host_link::tcp);
  auto shm = base;
  shm.merge_patch({{"strategy", {{"reducer", {{"algorithm", "device"}, {"same_host", "shm"}}}}}});
  CHECK(parse_job_config(shm).strategy.reducer.same_host == same_host_link::shared_memory);
  refused({{"devices", {"sim:0", "cpu:1"}}, {"strategy", {{"reducer", {{"algorithm", "device"}}}}}},
          "devices: the device all-reduce needs devices of one kind");
  // "nccl", the former name, still reads as "device", with one warning
  // naming the new spelling; the effective config says "device".
  auto old = base;
  old.merge_patch({{"strategy", {{"reducer", {{"algorithm", "nccl"}}}}}});
  test::captured_log log;
  const auto c = parse_job_config(old);
  const auto text = log.text();
  CHECK(text.find("strategy.reducer.algorithm: \"nccl\" is the former name of \"device\"") !=
        std::string::npos);
  CHECK(text.find("write \"device\"") != std::string::npos);
  CHECK(c.strategy.reducer.algorithm == reducer_algorithm::device);
  CHECK(to_json(c)["strategy"]["reducer"]["algorithm"] == "device");
  CHECK(parse_job_config(to_json(c)).strategy.reducer.algorithm == reducer_algorithm::device);
}

TEST_CASE(
    "NCCL across processes: the chief makes one group id for the build order, unless "
    "hierarchical") {
  if (!built_with_nccl()) {
    test::skip_case("this build has no NCCL");
    return;
  }
  auto mirrored = find_strategy("mirrored");
  REQUIRE(mirrored);
  job_config c;
  c.strategy.kind = "mirrored";
  c.strategy.replicas = 4;
  c.strategy.reducer.algorithm = reducer_algorithm::device;
  c.devices = {"cuda:0", "cuda:1"};
  auto id = mirrored->device_group_id(c, 2);
  REQUIRE(id.size() == 128);                       // ncclGetUniqueId needs no GPU
  CHECK(mirrored->device_group_id(c, 1).empty());  // one process: an in-process group
  auto other = mirrored->device_group_id(c, 2);
  CHECK(other != id);  // a fresh id per job
  // What a worker makes of the bytes it receives is the same group.
  nccl_unique_id raw{};
  std::copy(id.begin(), id.end(), raw.begin());
  CHECK(nccl_group_id(*make_nccl_rendezvous(4, raw)) == raw);
  c.strategy.reducer.hierarchical = true;
  CHECK(mirrored->device_group_id(c, 2).empty());
  c.strategy.reducer.hierarchical = false;
  c.devices = {"sim:0", "sim:1"};
  CHECK(mirrored->device_group_id(c, 2).empty());  // host groups are in-process: hierarchical
}

TEST_CASE("actor_learner on a discrete device is accepted at validation") {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/examples/cartpole_impala.json");
  auto j = nlohmann::json::parse(in);
  j["devices"] = {"cpu:0", "sim:1"};  // its learners compute there (tests/test_rl_devices.cpp)
  CHECK(parse_job_config(j).devices.at(1) == "sim:1");
}
