// Actor/learner RL figures, as JSON lines:
//   bench_rl acting [threads=1,2] [envs=16,64,256] [seconds=2]
//       env steps/s of rl_actor's device task (batched inference over M
//       CartPole environments, sampling, one batch step) on 1..N threads;
//   bench_rl learning [samples=640,2560] [seconds=2]
//       learner samples/s: V-trace, loss, backward, clip, Adam;
//   bench_rl beside [envs=64] [seconds=3]
//       two acting threads while a learner trains on a third (2 cores);
//   bench_rl solve [config=examples/cartpole_impala.json] [seeds=5]
//       `troupe run`'s time to solve over seeds: each seed's time and env
//       steps, the median and the worst;
//   bench_rl inference [config=examples/cartpole_impala.json] [envs=64,128,256]
//                      [env_steps=400000]
//       whole jobs' env steps/s with rl.inference "local", then "central",
//       at each M envs per actor;
//   bench_rl actors [actors=2] [envs=64,128,256] [seconds=3]
//       env steps/s of rl_actors alone (no learner; a queue that takes every
//       unroll at once) with local inference, then through an inference
//       server's batcher (actors in its process), then by message (as
//       actors in another process).
//   bench_rl pbt [config=examples/acrobot_pbt.json] [seeds=3] [fixed=1e-5]
//       population-based training against fixed learning rates in the same
//       env-step budget: per seed, whether each reached the target return,
//       its env steps to it, its best mean return.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/inference_server.hpp"
#include "actors/rl_actor.hpp"
#include "actors/system_config.hpp"
#include "bench/bench_sizes.hpp"
#include "envs/policy_head.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/optimizer.hpp"
#include "models/impala.hpp"
#include "runtime/job.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

std::string arg(const std::vector<std::string>& a, std::size_t i, const char* fallback) {
  return i < a.size() ? a[i] : fallback;
}

// "1,2,4" -> integers >= 1; throws std::invalid_argument naming the argument.
std::vector<int64_t> positive_list(const std::string& s, const std::string& what) {
  std::vector<int64_t> out;
  for (const auto& item : bench::split_list(s)) {
    std::size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != item.size() || v < 1)
      throw std::invalid_argument(what + ": expected integers >= 1, got '" + s + "'");
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument(what + ": expected integers >= 1, got '" + s + "'");
  return out;
}

double positive_number(const std::string& s, const std::string& what) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != s.size() || !(v > 0))
    throw std::invalid_argument(what + ": expected a number > 0, got '" + s + "'");
  return v;
}

model_config policy_model() {
  model_config m;
  m.kind = "policy_value_mlp";
  m.hidden = {64, 64};
  m.activation = "tanh";
  return m;
}

double since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// Acts unrolls of T = 20 steps until `stop`; returns env steps.
int64_t act_until(int64_t envs, uint64_t seed, const std::atomic<bool>& stop) {
  rl_actor_compute c;
  init_rl_actor_compute(c, "CartPole-v1", envs, policy_model(), seed, 1);
  int64_t steps = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    episode_report r;
    auto u = act_unroll(c, 0, 0, 20, r);
    steps += r.env_steps;
  }
  return steps;
}

// env steps/s of `threads` acting threads over `seconds`.
double acting_rate(int threads, int64_t envs, double seconds) {
  std::atomic<bool> stop{false};
  std::vector<int64_t> steps(static_cast<std::size_t>(threads));
  std::vector<std::thread> ts;
  auto t0 = clock_type::now();
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] { steps[static_cast<std::size_t>(i)] = act_until(envs, 7 + i, stop); });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : ts) t.join();
  double total = 0;
  for (auto s : steps) total += static_cast<double>(s);
  return total / since(t0);
}

// A batch of unrolls of `samples` steps in total (T = 20, M = samples / 20 / 2, 2 unrolls).
std::vector<unroll> learner_batch(int64_t samples) {
  const int64_t T = 20, U = 2, M = std::max<int64_t>(1, samples / T / U);
  std::vector<unroll> out;
  for (int64_t k = 0; k < U; ++k) {
    rl_actor_compute c;
    init_rl_actor_compute(c, "CartPole-v1", M, policy_model(), 100 + k, 1);
    episode_report r;
    out.push_back(act_unroll(c, k, 0, T, r));
  }
  return out;
}

// Learner updates until `stop`; returns samples.
int64_t learn_until(int64_t samples, const std::atomic<bool>& stop) {
  auto batch = learner_batch(samples);
  const int64_t n = batch.size() * batch[0].steps() * batch[0].envs();
  auto net = create_policy_value_model(policy_model(), 4, 2, 1);
  optimizer_config oc;
  kernels::optimizer opt(oc, 0);
  opt.init(net->variables());
  auto grads = net->make_gradients();
  impala_workspace ws;
  int64_t done = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    impala_gradients(*net, batch, {}, n, 0, grads, ws);
    clip_global_norm(grads, 40);
    opt.apply(net->variables(), grads);
    done += n;
  }
  return done;
}

double learning_rate(int64_t samples, double seconds) {
  std::atomic<bool> stop{false};
  int64_t done = 0;
  auto t0 = clock_type::now();
  std::thread t([&] { done = learn_until(samples, stop); });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  t.join();
  return static_cast<double>(done) / since(t0);
}

void print(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
}

int acting(const std::vector<std::string>& a) {
  auto threads = positive_list(arg(a, 0, "1,2"), "threads");
  auto envs = positive_list(arg(a, 1, "16,64,256"), "envs");
  const double seconds = positive_number(arg(a, 2, "2"), "seconds");
  for (auto t : threads)
    for (auto m : envs)
      print({{"bench", "rl_acting"},
             {"threads", t},
             {"envs_per_thread", m},
             {"env_steps_per_second", acting_rate(static_cast<int>(t), m, seconds)}});
  return 0;
}

int learning(const std::vector<std::string>& a) {
  auto sizes = positive_list(arg(a, 0, "640,2560"), "samples");
  const double seconds = positive_number(arg(a, 1, "2"), "seconds");
  for (auto s : sizes)
    print({{"bench", "rl_learning"},
           {"samples_per_update", s},
           {"samples_per_second", learning_rate(s, seconds)}});
  return 0;
}

int beside(const std::vector<std::string>& a) {
  const int64_t envs = positive_list(arg(a, 0, "64"), "envs").at(0);
  const double seconds = positive_number(arg(a, 1, "3"), "seconds");
  std::atomic<bool> stop{false};
  int64_t s0 = 0, s1 = 0, learned = 0;
  auto t0 = clock_type::now();
  std::thread a0([&] { s0 = act_until(envs, 1, stop); });
  std::thread a1([&] { s1 = act_until(envs, 2, stop); });
  std::thread l([&] { learned = learn_until(2560, stop); });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  a0.join();
  a1.join();
  l.join();
  const double t = since(t0);
  print({{"bench", "rl_beside"},
         {"acting_threads", 2},
         {"envs_per_thread", envs},
         {"env_steps_per_second", static_cast<double>(s0 + s1) / t},
         {"learner_samples_per_second", static_cast<double>(learned) / t}});
  return 0;
}

int solve(const std::vector<std::string>& a) {
  const std::string file = arg(a, 0, "examples/cartpole_impala.json");
  const auto seeds = positive_list(arg(a, 1, "5"), "seeds").at(0);
  std::vector<double> times;
  for (int64_t s = 1; s <= seeds; ++s) {
    auto c = load_job_config(file);
    c.seed = static_cast<uint64_t>(s);
    c.logging.level = "warn";
    c.logging.output_dir = "runs/bench_rl_solve";
    c.checkpoint.save_at_end = false;
    job_options o;
    o.overwrite = true;
    auto sum = run_job(c, o);
    const bool solved = sum.value("solved", false);
    const double t =
        solved ? sum["time_to_solve_seconds"].get<double>() : sum["wall_seconds"].get<double>();
    times.push_back(solved ? t : 1e9);
    print({{"bench", "rl_solve"},
           {"config", file},
           {"seed", s},
           {"solved", solved},
           {"seconds", t},
           {"env_steps", sum["env_steps"]},
           {"env_steps_per_second", sum["env_steps_per_second"]}});
  }
  std::sort(times.begin(), times.end());
  print({{"bench", "rl_solve_summary"},
         {"config", file},
         {"seeds", seeds},
         {"median_seconds", times[times.size() / 2]},
         {"worst_seconds", times.back()}});
  return 0;
}

// Takes every unroll at once: acting without a learner's back-pressure.
trajectory_queue_actor::behavior_type taking_queue(trajectory_queue_actor::pointer) {
  return {[](enqueue_atom, unroll&) -> int64_t { return 0; },
          [](dequeue_atom, int64_t) -> std::vector<unroll> { return {}; },
          [](version_atom, int64_t) {}, [](stats_atom) -> queue_stats { return {}; }};
}

// Counts the env steps the actors report.
rl_reports_actor::behavior_type counting_coordinator(rl_reports_actor::pointer,
                                                     std::atomic<int64_t>* steps) {
  return {[steps](episodes_atom, episode_report& r) { *steps += r.env_steps; },
          [](learned_atom, learner_report&) {}, [](weights_atom, policy_weights&) {}};
}

// env steps/s of `actors` rl_actors of M CartPole environments (T = 20)
// over `seconds` after a warm-up, acting with their own policies ("local")
// or through an inference server: its batcher ("central", the path of
// actors in the server's process) or messages ("central_messages", the
// path of actors in another process); no learner.
double actors_rate(const std::string& mode, int64_t actors, int64_t envs, double seconds) {
  const bool central = mode != "local";
  system_config cfg;
  caf::actor_system sys{cfg};
  device_pool devices;
  std::atomic<int64_t> steps{0};
  auto queue = sys.spawn(taking_queue);
  auto coordinator = sys.spawn(counting_coordinator, &steps);
  const auto head = envs::policy_head_for(envs::make_env("CartPole-v1", 1)->spec(), "auto");
  auto net = create_policy_value_model(policy_model(), 4, head, 1);
  policy_weights w{1, {}};
  for (auto& v : net->variables()) w.values.push_back(v.value);
  inference_server_actor server;
  if (central) {
    inference_server_config ic;
    ic.device = devices.get("inference_server");
    ic.model = policy_model();
    ic.observation_size = 4;
    ic.head = head;
    ic.seed = 1;
    ic.actors = actors;
    server = spawn_inference_server(sys, ic);
    caf::anon_send(server, weights_atom::value, w);
  }
  std::vector<rl_actor_actor> handles;
  for (int64_t i = 0; i < actors; ++i) {
    rl_actor_config ac;
    ac.index = i;
    ac.device = devices.get("cpu:" + std::to_string(i));
    ac.envs = envs;
    ac.unroll_length = 20;
    ac.model = policy_model();
    ac.seed = 1;
    ac.queue = queue;
    ac.coordinator = coordinator;
    ac.inference = server;
    ac.inference_in_process = mode == "central";
    handles.push_back(spawn_rl_actor(sys, ac));
    if (!central) caf::anon_send(handles.back(), weights_atom::value, w);
    caf::anon_send(handles.back(), run_atom::value);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // warm-up
  const int64_t s0 = steps.load();
  auto t0 = clock_type::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double rate = static_cast<double>(steps.load() - s0) / since(t0);
  for (auto& h : handles) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  if (server) caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(queue, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  return rate;
}

int acting_central(const std::vector<std::string>& a) {
  const auto actors = positive_list(arg(a, 0, "2"), "actors").at(0);
  const auto envs = positive_list(arg(a, 1, "64,128,256"), "envs");
  const double seconds = positive_number(arg(a, 2, "3"), "seconds");
  for (auto m : envs)
    for (const char* mode : {"local", "central", "central_messages"})
      print({{"bench", "rl_actors"},
             {"inference", mode},
             {"actors", actors},
             {"envs_per_actor", m},
             {"env_steps_per_second", actors_rate(mode, actors, m, seconds)}});
  return 0;
}

// Whole actor_learner jobs from `file` with local, then central inference,
// for each M envs per actor: env steps/s over `env_steps` steps (no target
// return, so both run the same number of steps), alternated per M.
int inference(const std::vector<std::string>& a) {
  const std::string file = arg(a, 0, "examples/cartpole_impala.json");
  const auto envs = positive_list(arg(a, 1, "64,128,256"), "envs");
  const auto env_steps = positive_list(arg(a, 2, "400000"), "env_steps").at(0);
  for (auto m : envs)
    for (const char* mode : {"local", "central"}) {
      auto c = load_job_config(file);
      c.rl.inference = mode;
      c.rl.envs_per_actor = m;
      c.training.target_return.reset();
      c.training.max_env_steps = env_steps;
      c.logging.level = "warn";
      c.logging.output_dir = "runs/bench_rl_inference";
      c.checkpoint.save_at_end = false;
      job_options o;
      o.overwrite = true;
      auto sum = run_job(c, o);
      print({{"bench", "rl_inference"},
             {"inference", mode},
             {"actors", c.rl.actors},
             {"envs_per_actor", m},
             {"env_steps", sum["env_steps"]},
             {"updates", sum["updates"]},
             {"env_steps_per_second", sum["env_steps_per_second"]}});
    }
  return 0;
}

// One seed of `c` (a population or a fixed learning rate) to its target
// return or its env-step budget: a figures line.
nlohmann::json pbt_run(job_config c, uint64_t seed, const std::string& setup) {
  c.seed = seed;
  c.logging.level = "warn";
  c.logging.output_dir = "runs/bench_rl_pbt";
  c.checkpoint.save_at_end = false;
  job_options o;
  o.overwrite = true;
  auto sum = run_job(c, o);
  nlohmann::json line = {{"bench", "rl_pbt"},
                         {"setup", setup},
                         {"seed", seed},
                         {"solved", sum.value("solved", false)},
                         {"env_steps", sum["env_steps"]},
                         {"env_steps_to_solve", sum["env_steps_to_solve"]},
                         {"best_mean_return_100", sum["best_mean_return_100"]},
                         {"mean_return_100", sum["mean_return_100"]},
                         {"wall_seconds", sum["wall_seconds"]}};
  if (sum.contains("population")) {
    const auto& p = sum["population"];
    const auto best = p["best_member"].get<std::size_t>();
    line["best_member_learning_rate"] = p["members"][best]["learning_rate"];
    line["exploits"] = p["exploits"];
  }
  return line;
}

// Population-based training against fixed learning rates (issue 41): `file`'s
// population (learning rates spanning 1e-5 to 1e-1) and, in the same
// env-step budget (training.max_env_steps) with the same actors, one member
// alone at each fixed rate, alternated per seed. Solved: the mean return of
// the last 100 episodes reached training.target_return.
int pbt(const std::vector<std::string>& a) {
  const std::string file = arg(a, 0, "examples/acrobot_pbt.json");
  const auto seeds = positive_list(arg(a, 1, "3"), "seeds").at(0);
  const std::string fixed = arg(a, 2, "1e-5");
  std::vector<double> rates;
  for (std::size_t at = 0; at <= fixed.size();) {
    const auto end = std::min(fixed.find(',', at), fixed.size());
    rates.push_back(std::stod(fixed.substr(at, end - at)));
    at = end + 1;
  }
  const auto base = load_job_config(file);
  if (base.rl.population.size == 0) throw std::invalid_argument(file + " has no rl.population");
  for (int64_t s = 1; s <= seeds; ++s) {
    print(pbt_run(base, static_cast<uint64_t>(s), "population"));
    for (double lr : rates) {
      auto c = base;
      c.rl.population = {};
      c.optimizer.learning_rate = lr;
      char setup[48];
      std::snprintf(setup, sizeof setup, "fixed lr %g", lr);
      print(pbt_run(c, static_cast<uint64_t>(s), setup));
    }
  }
  return 0;
}

// One whole actor_learner job from `file` (an Atari or MuJoCo example) run
// for `env_steps` env steps, no target return: env steps/s and frames/s
// (env steps times `frame_skip`, 4 under atari_preprocessing), with the
// learner running beside the actors, and the returns the run reached; its
// metrics every `log_every` updates (the return's course) in
// runs/bench_rl_frames/metrics.jsonl.
int frames(const std::vector<std::string>& a) {
  const std::string file = arg(a, 0, "examples/pong_impala.json");
  const auto env_steps = positive_list(arg(a, 1, "20000"), "env_steps").at(0);
  const auto frame_skip = positive_list(arg(a, 2, "1"), "frame_skip").at(0);
  const auto log_every = positive_list(arg(a, 3, "100"), "log_every").at(0);
  auto c = load_job_config(file);
  c.training.target_return.reset();
  c.training.max_env_steps = env_steps;
  c.logging.every_steps = log_every;
  c.logging.level = "warn";
  c.logging.output_dir = "runs/bench_rl_frames";
  c.checkpoint.save_at_end = false;
  c.checkpoint.every_steps = 0;
  job_options o;
  o.overwrite = true;
  auto sum = run_job(c, o);
  const double rate = sum["env_steps_per_second"].get<double>();
  print({{"bench", "rl_frames"},
         {"config", file},
         {"env", sum["env"]},
         {"actors", c.rl.actors},
         {"envs_per_actor", c.rl.envs_per_actor},
         {"env_steps", sum["env_steps"]},
         {"updates", sum["updates"]},
         {"episodes", sum["episodes"]},
         {"env_steps_per_second", rate},
         {"frames_per_second", rate * static_cast<double>(frame_skip)},
         {"mean_return_100", sum["mean_return_100"]},
         {"best_mean_return_100", sum["best_mean_return_100"]}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kernels::init_cpu_kernels();
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string what = args.empty() ? "" : args[0];
  std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  try {
    if (what == "acting") return acting(rest);
    if (what == "learning") return learning(rest);
    if (what == "beside") return beside(rest);
    if (what == "solve") return solve(rest);
    if (what == "inference") return inference(rest);
    if (what == "actors") return acting_central(rest);
    if (what == "pbt") return pbt(rest);
    if (what == "frames") return frames(rest);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_rl: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_rl: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: bench_rl acting|learning|beside|solve|inference|actors|pbt|frames [args] "
               "(see "
               "bench/rl.cpp)\n");
  return 2;
}
