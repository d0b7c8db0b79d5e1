// Ape-X replay shard throughput, as JSON lines:
//   bench_replay [shards=1,2] [seconds=3] [insert_batch=64] [sample_batch=256]
// For each shard count: one inserter actor keeps 4 inserts of
// insert_batch CartPole-sized transitions in flight on every shard (as
// rl_actors would), one sampler actor keeps 2 samples of sample_batch in
// flight on every shard and sends a priority update back for each (as a
// learner would). Prints transitions inserted and sampled per second, and
// their sum, from the shards' own counters.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/replay_shard.hpp"
#include "actors/system_config.hpp"
#include "bench/bench_sizes.hpp"

using namespace troupe;

namespace {

constexpr int64_t kObs = 4;  // CartPole
constexpr int kInsertsInFlight = 4, kSamplesInFlight = 2;

transition_batch random_batch(int64_t n, splitmix64& rng) {
  transition_batch b;
  b.observations = tensor({n, kObs});
  b.next_observations = tensor({n, kObs});
  b.actions = tensor({n}, dtype::i32);
  b.returns = tensor({n});
  b.discounts = tensor({n});
  b.priorities = tensor({n});
  for (int64_t i = 0; i < n * kObs; ++i) b.observations.f32()[i] = static_cast<float>(rng.normal());
  for (int64_t i = 0; i < n; ++i) {
    b.actions.data<int32_t>()[i] = static_cast<int32_t>(rng.next() % 2);
    b.discounts.f32()[i] = 0.97f;
    b.priorities.f32()[i] = static_cast<float>(0.01 + rng.uniform());
  }
  return b;
}

// Re-sends one insert to `shard` each time one is answered, until stopped.
void insert_loop(caf::event_based_actor* self, replay_shard_actor shard,
                 std::shared_ptr<transition_batch> batch) {
  self->request(shard, caf::infinite, insert_atom::value, *batch)
      .then([self, shard, batch](int64_t) { insert_loop(self, shard, batch); },
            [self](caf::error&) { self->quit(); });
}

// Samples from `shard` and answers each sample with new priorities.
void sample_loop(caf::event_based_actor* self, replay_shard_actor shard, int64_t n,
                 std::shared_ptr<splitmix64> rng) {
  self->request(shard, caf::infinite, sample_atom::value, n)
      .then(
          [self, shard, n, rng](replay_sample& s) {
            priority_update u{std::move(s.ids), std::vector<float>(static_cast<std::size_t>(n))};
            for (auto& p : u.priorities) p = static_cast<float>(0.01 + rng->uniform());
            self->send(shard, priority_atom::value, std::move(u));
            sample_loop(self, shard, n, rng);
          },
          [self](caf::error&) { self->quit(); });
}

nlohmann::json measure(caf::actor_system& sys, int64_t shards, double seconds, int64_t insert_n,
                       int64_t sample_n) {
  std::vector<replay_shard_actor> all;
  for (int64_t i = 0; i < shards; ++i) {
    replay_shard_config c;
    c.index = i;
    c.capacity = 1 << 20;  // Ape-X's 2M transitions over 2 shards
    c.min_size = 4096;
    c.observation_size = kObs;
    c.seed = 1;
    all.push_back(spawn_replay_shard(sys, c));
  }
  splitmix64 rng(5);
  auto batch = std::make_shared<transition_batch>(random_batch(insert_n, rng));
  auto inserter = sys.spawn([all, batch](caf::event_based_actor* self) {
    for (const auto& s : all)
      for (int k = 0; k < kInsertsInFlight; ++k) insert_loop(self, s, batch);
  });
  auto sampler = sys.spawn([all, sample_n](caf::event_based_actor* self) {
    auto r = std::make_shared<splitmix64>(9);
    for (const auto& s : all)
      for (int k = 0; k < kSamplesInFlight; ++k) sample_loop(self, s, sample_n, r);
  });
  caf::scoped_actor self{sys};
  auto totals = [&] {
    replay_stats sum;
    for (const auto& s : all)
      self->request(s, std::chrono::seconds(30), stats_atom::value)
          .receive(
              [&](replay_stats& x) {
                sum.inserted += x.inserted;
                sum.sampled += x.sampled;
              },
              [](caf::error&) {});
    return sum;
  };
  // Timed after replay holds min_size, so samples flow from the start.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  const auto a = totals();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const auto b = totals();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto h : {caf::actor_cast<caf::actor>(inserter), caf::actor_cast<caf::actor>(sampler)})
    self->send_exit(h, caf::exit_reason::user_shutdown);
  for (const auto& s : all) self->send_exit(s, caf::exit_reason::user_shutdown);
  const double ins = static_cast<double>(b.inserted - a.inserted) / dt;
  const double smp = static_cast<double>(b.sampled - a.sampled) / dt;
  return {{"bench", "replay_shards"},
          {"shards", shards},
          {"insert_batch", insert_n},
          {"sample_batch", sample_n},
          {"seconds", dt},
          {"inserts_per_second", ins},
          {"samples_per_second", smp},
          {"transitions_per_second", ins + smp}};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    auto shard_counts = bench::split_list(a.size() > 0 ? a[0] : "1,2");
    const double seconds = std::stod(a.size() > 1 ? a[1] : "3");
    const int64_t insert_n = std::stoll(a.size() > 2 ? a[2] : "64");
    const int64_t sample_n = std::stoll(a.size() > 3 ? a[3] : "256");
    if (seconds <= 0 || insert_n < 1 || sample_n < 1)
      throw std::invalid_argument("seconds, insert_batch and sample_batch must be positive");
    system_config cfg;
    caf::actor_system sys{cfg};
    for (const auto& s : shard_counts) {
      const int64_t n = std::stoll(s);
      if (n < 1) throw std::invalid_argument("shards: expected integers >= 1, got '" + s + "'");
      std::printf("%s\n", measure(sys, n, seconds, insert_n, sample_n).dump().c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_replay: %s\n", e.what());
    return 2;
  }
  return 0;
}
