// Parameter-server messaging throughput: W worker actors x S variable shards
// in one process. Every worker runs `window` independent chains per shard,
// each looping push (gradients for all of the shard's pieces) -> pull (all
// pieces) with non-blocking request/then, for a fixed time. Prints one JSON
// line per case with the median of the repeats.
//
// bench_ps_updates [seconds=2] [repeats=3] [window=4] [workers=4] [shards=2] [detached=0]
//
// Cases: "small" (one 256-float variable per shard, 1 KB pushes, SGD) and
// "mlp" (the MLP 784-256-256-10's variables, fixed_shards over the shards:
// every variable split in S near-equal pieces, Adam).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/partitioner.hpp"
#include "actors/system_config.hpp"
#include "actors/variable_shard.hpp"
#include "bench/bench_common.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

struct worker_state {
  int64_t id = 0;
  std::vector<variable_shard_actor> shards;
  std::vector<std::vector<named_tensor>> grads;  // per shard, shared by every push
  std::vector<int64_t> push_bytes;               // per shard
  std::vector<int64_t> version;                  // per shard: last pulled
  clock_type::time_point deadline;
  caf::actor collector;
  int64_t step = 0;
  int active = 0;  // chains still running
  int64_t pushes = 0, pulls = 0, bytes = 0;
  std::string error;
  static inline const char* name = "ps_bench_worker";
};

using worker_ptr = caf::stateful_actor<worker_state>*;

void chain_done(worker_ptr self) {
  auto& st = self->state;
  if (--st.active > 0) return;
  self->send(st.collector, st.pushes, st.pulls, st.bytes, st.error);
  self->quit();
}

void chain(worker_ptr self, std::size_t s) {
  auto& st = self->state;
  if (clock_type::now() >= st.deadline || !st.error.empty()) return chain_done(self);
  self->request(st.shards[s], caf::infinite, push_atom::value, st.id, st.step++, st.version[s],
                st.grads[s])
      .then(
          [self, s](int64_t) {
            auto& st = self->state;
            ++st.pushes;
            st.bytes += st.push_bytes[s];
            self->request(st.shards[s], caf::infinite, pull_atom::value, std::vector<std::string>{})
                .then(
                    [self, s](const shard_values& v) {
                      auto& st = self->state;
                      ++st.pulls;
                      for (const auto& x : v.values)
                        st.bytes += static_cast<int64_t>(x.value.nbytes());
                      st.version[s] = v.version;
                      chain(self, s);
                    },
                    [self](caf::error& e) {
                      self->state.error = describe(e);
                      chain_done(self);
                    });
          },
          [self](caf::error& e) {
            self->state.error = describe(e);
            chain_done(self);
          });
}

caf::behavior worker(worker_ptr self, worker_state init, int window) {
  self->state = std::move(init);
  self->state.active = window * static_cast<int>(self->state.shards.size());
  for (int w = 0; w < window; ++w)
    for (std::size_t s = 0; s < self->state.shards.size(); ++s) chain(self, s);
  return {[](caf::ok_atom) {}};  // all work is in the chains' continuations
}

struct run_result {
  double pushes_per_second = 0, pulls_per_second = 0, bytes_per_second = 0;
  double staleness_mean = 0;
  int64_t staleness_max = 0;
};

run_result run_once(const std::vector<std::vector<named_tensor>>& pieces_by_shard,
                    const optimizer_config& opt, int workers, int window, double seconds,
                    bool detached) {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::vector<variable_shard_actor> shards;
  std::vector<std::vector<named_tensor>> grads;
  std::vector<int64_t> push_bytes;
  for (std::size_t s = 0; s < pieces_by_shard.size(); ++s) {
    variable_shard_config c;
    c.index = static_cast<int64_t>(s);
    c.pieces = pieces_by_shard[s];
    c.optimizer = opt;
    c.total_steps = 1 << 30;
    c.detached = detached;
    shards.push_back(spawn_variable_shard(sys, c));
    std::vector<named_tensor> g;
    int64_t b = 0;
    for (const auto& p : pieces_by_shard[s]) {
      tensor t(p.value.shape());
      t.fill(1e-6f);
      b += static_cast<int64_t>(t.nbytes());
      g.push_back({p.name, t});
    }
    grads.push_back(std::move(g));
    push_bytes.push_back(b);
  }
  const auto t0 = clock_type::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  for (int w = 0; w < workers; ++w) {
    worker_state ws;
    ws.id = w;
    ws.shards = shards;
    ws.grads = grads;
    ws.push_bytes = push_bytes;
    ws.version.assign(shards.size(), 0);
    ws.deadline = deadline;
    ws.collector = caf::actor_cast<caf::actor>(self);
    sys.spawn(worker, std::move(ws), window);
  }
  int64_t pushes = 0, pulls = 0, bytes = 0;
  for (int w = 0; w < workers; ++w)
    self->receive([&](int64_t pu, int64_t pl, int64_t b, const std::string& err) {
      if (!err.empty()) std::fprintf(stderr, "worker error: %s\n", err.c_str());
      pushes += pu;
      pulls += pl;
      bytes += b;
    });
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  run_result r{pushes / secs, pulls / secs, bytes / secs, 0, 0};
  double stale_sum = 0;
  int64_t stale_n = 0;
  for (const auto& s : shards) {
    self->request(s, caf::infinite, stats_atom::value)
        .receive(
            [&](const shard_stats& st) {
              stale_sum += st.staleness_mean * static_cast<double>(st.pushes);
              stale_n += st.pushes;
              r.staleness_max = std::max(r.staleness_max, st.staleness_max);
            },
            [&](caf::error& e) { std::fprintf(stderr, "stats: %s\n", describe(e).c_str()); });
    self->send_exit(s, caf::exit_reason::user_shutdown);
  }
  r.staleness_mean = stale_n ? stale_sum / static_cast<double>(stale_n) : 0.0;
  return r;
}

void run_case(const std::string& name, const std::vector<variable_desc>& vars,
              const partitioner_config& part, const optimizer_config& opt, int workers, int shards,
              int window, double seconds, int repeats, bool detached) {
  auto p = partition_variables(vars, shards, part);
  std::vector<named_tensor> values;
  for (const auto& v : vars) {
    tensor t(v.shape);
    t.fill(0.01f);
    values.push_back({v.name, t});
  }
  auto by_shard = split_for_shards(values, p, shards);
  int64_t push_bytes = 0;
  for (const auto& v : values) push_bytes += static_cast<int64_t>(v.value.nbytes());
  std::vector<double> pu, pl, by, sm;
  int64_t smax = 0;
  for (int r = 0; r < repeats; ++r) {
    auto x = run_once(by_shard, opt, workers, window, seconds, detached);
    pu.push_back(x.pushes_per_second);
    pl.push_back(x.pulls_per_second);
    by.push_back(x.bytes_per_second);
    sm.push_back(x.staleness_mean);
    smax = std::max(smax, x.staleness_max);
  }
  const double pushes = bench::median(pu), pulls = bench::median(pl);
  std::printf("%s\n", nlohmann::json{{"bench", "ps_updates"},
                                     {"case", name},
                                     {"workers", workers},
                                     {"shards", shards},
                                     {"window", window},
                                     {"detached", detached},
                                     {"optimizer", opt.kind},
                                     {"pieces", p.size()},
                                     {"model_bytes", push_bytes},
                                     {"pushes_per_second", pushes},
                                     {"pulls_per_second", pulls},
                                     {"updates_per_second", pushes + pulls},
                                     {"bytes_per_second", bench::median(by)},
                                     {"staleness_mean", bench::median(sm)},
                                     {"staleness_max", smax},
                                     {"seconds", seconds},
                                     {"repeats", repeats}}
                          .dump()
                          .c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  const int window = argc > 3 ? std::atoi(argv[3]) : 4;
  const int workers = argc > 4 ? std::atoi(argv[4]) : 4;
  const int shards = argc > 5 ? std::atoi(argv[5]) : 2;
  const bool detached = argc > 6 && std::atoi(argv[6]) != 0;
  if (seconds <= 0 || repeats < 1 || window < 1 || workers < 1 || shards < 1) {
    std::fprintf(stderr,
                 "usage: bench_ps_updates [seconds=2] [repeats=3] [window=4] [workers=4] "
                 "[shards=2] [detached=0]\n");
    return 2;
  }

  std::vector<variable_desc> small;
  for (int s = 0; s < shards; ++s) {
    std::string name = "v";  // not "v" + ...: GCC 12 -Wrestrict false positive
    name += std::to_string(s);
    small.push_back({name, {256}});
  }
  optimizer_config sgd;
  sgd.kind = "sgd";
  sgd.learning_rate = 1e-3;
  run_case("small", small, {}, sgd, workers, shards, window, seconds, repeats, detached);

  std::vector<variable_desc> mlp{{"dense_0/kernel", {784, 256}}, {"dense_0/bias", {256}},
                                 {"dense_1/kernel", {256, 256}}, {"dense_1/bias", {256}},
                                 {"dense_2/kernel", {256, 10}},  {"dense_2/bias", {10}}};
  partitioner_config fixed;
  fixed.kind = "fixed_shards";
  optimizer_config adam;  // the default: adam, lr 0.001
  run_case("mlp", mlp, fixed, adam, workers, shards, window, seconds, repeats, detached);
  return 0;
}
