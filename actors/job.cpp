#include "actors/job.hpp"

#include <spdlog/spdlog.h>

#include <caf/io/all.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "actors/coordinator.hpp"
#include "actors/input_pipeline.hpp"
#include "actors/job_parts.hpp"
#include "actors/partitioner.hpp"
#include "actors/reducer.hpp"
#include "actors/replica.hpp"
#include "actors/system_config.hpp"
#include "actors/variable_shard.hpp"
#include "devices/device.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/optimizer.hpp"
#include "models/model.hpp"

namespace troupe {

namespace fs = std::filesystem;

std::string output_dir_for(const job_config& c, const job_options& o) {
  if (!o.output_dir.empty()) return o.output_dir;
  if (!c.logging.output_dir.empty()) return c.logging.output_dir;
  return "runs/" + c.name;
}

namespace detail {

bool uses_replicas_only(const job_config& c) {
  return c.strategy.kind == "one_device" || c.strategy.kind == "mirrored";
}
bool elastic(const job_config& c) {
  return c.strategy.kind == "elastic_average";
}
bool uses_shards(const job_config& c) {
  return c.strategy.kind == "central_storage" || c.strategy.kind == "parameter_server" ||
         elastic(c);
}
bool async_workers(const job_config& c) {
  return c.strategy.kind == "parameter_server" || elastic(c);
}

// EASGD's moving rate: given, or beta / tau / p with beta = 0.9 (the paper's
// choice of beta = p * alpha, per communication period).
double moving_rate(const job_config& c) {
  if (c.strategy.moving_rate > 0) return c.strategy.moving_rate;
  return 0.9 / static_cast<double>(c.strategy.communication_period) /
         static_cast<double>(c.strategy.replicas);
}

// The center's "optimizer": c += d is SGD with learning rate -1 applied to d
// (w - (-1) d is exactly w + d in floating point).
optimizer_config center_update() {
  optimizer_config o;
  o.kind = "sgd";
  o.learning_rate = -1.0;
  return o;
}

// parameter_server: W workers each read a batch of data.batch_size per step,
// disjoint slices of one "round" of W batches; an epoch is W rounds' worth of
// pushes per round of the data.
int64_t updates_per_epoch(const job_config& c, int64_t examples) {
  if (async_workers(c))
    return c.strategy.replicas *
           batches_per_epoch(examples, c.data.batch_size * c.strategy.replicas, 1);
  return batches_per_epoch(examples, c.data.batch_size, c.strategy.steps_per_update);
}

// central_storage, parameter_server, elastic_average: the model's initial
// variables (the same seed as every other strategy), placed and split over
// the shards.
shard_set plan_shards(const job_config& c, const job_plan& plan) {
  auto net = create_model(c.model, {plan.train->features(), plan.train->classes}, c.seed);
  std::vector<variable_desc> descs;
  for (const auto& v : net->variables()) descs.push_back({v.name, v.value.shape(), v.value.type()});
  shard_set out;
  try {
    out.place = partition_variables(descs, c.strategy.shards, c.strategy.partitioner);
  } catch (const std::invalid_argument& e) {
    throw job_error(e.what());
  }
  const optimizer_config opt = elastic(c) ? center_update() : c.optimizer;
  out.slot_suffixes = kernels::optimizer(opt, plan.total_steps).slot_names();
  return out;
}

void spawn_shards(caf::actor_system& sys, const job_config& c, const job_plan& plan,
                  const std::vector<int64_t>& indices, shard_set& set) {
  auto net = create_model(c.model, {plan.train->features(), plan.train->classes}, c.seed);
  auto pieces = split_for_shards(net->variables(), set.place, c.strategy.shards);
  const optimizer_config opt = elastic(c) ? center_update() : c.optimizer;
  for (int64_t s : indices) {
    variable_shard_config sc;
    sc.index = s;
    sc.pieces = std::move(pieces[static_cast<std::size_t>(s)]);
    sc.optimizer = opt;
    sc.total_steps = plan.total_steps;
    bool aggregate = elastic(c) ? c.strategy.synchronous : !async_workers(c);
    sc.aggregate = aggregate ? c.strategy.replicas : 0;
    sc.apply_late_pushes = elastic(c);
    // An update of a model-sized piece takes a while: keep it off the
    // scheduler threads that route everyone's messages.
    sc.detached = true;
    set.actors.push_back(spawn_variable_shard(sys, std::move(sc)));
    spdlog::info("variable_shard {}: {}", s, [&] {
      std::string names;
      for (const auto& p : pieces_on_shard(set.place, s))
        names += (names.empty() ? "" : ", ") + p.piece_name;
      return names;
    }());
  }
}

// Where a resumed job starts. Strategies count steps differently (a
// parameter_server or elastic_average step is one worker's batch, a mirrored
// step a global batch), so a checkpoint of another kind of strategy resumes
// at the same position in the data: its epoch, and the same fraction of it.
int64_t start_step_for(const checkpoint::snapshot& snap, int64_t steps_per_epoch,
                       int64_t examples) {
  const auto& m = snap.meta;
  int64_t then_per_epoch = 0;
  try {
    then_per_epoch = updates_per_epoch(parse_job_config(m.config), examples);
  } catch (const std::exception&) {
    return m.step;  // an older or foreign config: trust the step count
  }
  if (then_per_epoch == steps_per_epoch || then_per_epoch <= 0) return m.step;
  spdlog::info("the checkpoint counts {} steps per epoch, this job {}: resuming at epoch {}",
               then_per_epoch, steps_per_epoch, m.epoch);
  return m.epoch * steps_per_epoch + m.batch_in_epoch * steps_per_epoch / then_per_epoch;
}

std::shared_ptr<job_plan> make_plan(const job_config& c, const job_options& o, bool owner) {
  auto plan = std::make_shared<job_plan>();
  plan->config = c;
  plan->options = o;
  if (!uses_replicas_only(c) && !uses_shards(c))
    throw config_error("strategy.kind", "\"" + c.strategy.kind +
                                            "\" is not implemented yet in this build (available: "
                                            "\"one_device\", \"mirrored\", \"central_storage\", "
                                            "\"parameter_server\", \"elastic_average\")");
  for (std::size_t i = 0; i < c.devices.size(); ++i) {
    try {
      check_device_available(parse_device(c.devices[i]));
    } catch (const device_error& e) {
      throw job_error("devices[" + std::to_string(i) + "]: " + e.what());
    }
  }
  plan->output_dir = output_dir_for(c, o);
  plan->owner = owner;
  plan->checkpoint_dir = c.checkpoint.dir.empty()
                             ? (fs::path(plan->output_dir) / "checkpoints").string()
                             : c.checkpoint.dir;
  std::error_code ec;
  if (owner) fs::create_directories(plan->output_dir, ec);
  if (ec)
    throw job_error("cannot create output directory '" + plan->output_dir + "': " + ec.message());

  auto t0 = std::chrono::steady_clock::now();
  auto tt = data::load_fashion_mnist(c.data);
  spdlog::info("data: {} training and {} test examples from {} ({:.2f} s)", tt.train.size(),
               tt.test.size(), c.data.path,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (tt.train.size() == 0) throw job_error("data: the training set is empty");
  plan->train = std::make_shared<const data::dataset>(std::move(tt.train));
  plan->test = std::make_shared<const data::dataset>(std::move(tt.test));
  plan->steps_per_epoch = updates_per_epoch(c, plan->train->size());
  plan->total_steps = c.training.epochs * plan->steps_per_epoch;
  if (c.training.max_steps > 0)
    plan->total_steps = std::min(plan->total_steps, c.training.max_steps);

  if (!owner) return plan;
  if (!o.resume) {
    if (auto old = checkpoint::resolve(plan->checkpoint_dir)) {
      if (!o.overwrite)
        throw job_error("checkpoint directory '" + plan->checkpoint_dir +
                        "' already holds checkpoints of an earlier run (latest: " + *old +
                        "); pass --resume to continue it, --overwrite to start over, or choose "
                        "another --output");
      spdlog::warn("--overwrite: removing earlier checkpoints in {}", plan->checkpoint_dir);
      fs::remove_all(plan->checkpoint_dir);
    }
  }
  if (o.resume) {
    auto dir = checkpoint::resolve(plan->checkpoint_dir);
    if (!dir) throw job_error("--resume: no checkpoint found in '" + plan->checkpoint_dir + "'");
    plan->resume_from = checkpoint::load(*dir);
    plan->start_step =
        start_step_for(*plan->resume_from, plan->steps_per_epoch, plan->train->size());
    spdlog::info("resuming from {} (step {}, saved under strategy {})", *dir, plan->start_step,
                 plan->resume_from->meta.strategy);
  }
  std::ofstream(fs::path(plan->output_dir) / "config.json") << to_json(c).dump(2) << '\n';
  return plan;
}

std::vector<std::pair<std::string, caf::actor>> worker_parts::named() const {
  std::vector<std::pair<std::string, caf::actor>> out;
  for (std::size_t i = 0; i < pipelines.size(); ++i)
    out.emplace_back("input_pipeline " + std::to_string(indices[i]),
                     caf::actor_cast<caf::actor>(pipelines[i]));
  for (std::size_t i = 0; i < reducers.size(); ++i)
    out.emplace_back("reducer " + std::to_string(indices[i]),
                     caf::actor_cast<caf::actor>(reducers[i]));
  return out;
}

void worker_parts::stop() const {
  for (auto& r : replicas) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  for (auto& p : pipelines) caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  for (auto& q : reducers) caf::anon_send_exit(q, caf::exit_reason::user_shutdown);
}

reducer_config reducer_config_of(const job_config& c) {
  reducer_config r;
  r.algorithm = c.strategy.reducer.algorithm;
  r.bucket_bytes = c.strategy.reducer.bucket_bytes;
  r.chunk_bytes = c.strategy.reducer.chunk_bytes;
  return r;
}

bool gathers_on_device(const std::string& gather, bool synchronous,
                       const std::vector<std::string>& devices) {
  if (gather != "auto") return gather == "device";
  std::set<std::string> threads(devices.begin(), devices.end());
  return synchronous && threads.size() >= std::max(1u, std::thread::hardware_concurrency());
}

worker_parts spawn_workers(caf::actor_system& sys, const job_config& c, const job_plan& plan,
                           worker_spec spec, const job_options& o) {
  worker_parts out;
  out.indices = spec.indices;
  out.reducers = spec.reducers;
  const int64_t n = c.strategy.replicas;
  const bool gather_on_device = gathers_on_device(c.data.gather, !async_workers(c), spec.devices);
  // The process's devices share their background work (the gathers).
  auto group = std::make_shared<device_group>();
  for (std::size_t k = 0; k < spec.indices.size(); ++k) {
    const int64_t r = spec.indices[k];
    const auto& dev = spec.devices[k];
    auto& device = out.devices[dev];
    if (!device) device = std::make_shared<cpu_device>("troupe:" + dev, group);
    input_pipeline_config ic;
    ic.data = plan.train;
    ic.global_batch = async_workers(c) ? c.data.batch_size * n : c.data.batch_size;
    ic.steps_per_update = c.strategy.steps_per_update;
    ic.shuffle = c.data.shuffle;
    ic.seed = c.seed;
    ic.prefetch = c.data.prefetch;
    ic.context = {1, 0, n};
    ic.replica = r;
    ic.start_epoch = spec.start_step / plan.steps_per_epoch;
    ic.start_index = spec.start_step % plan.steps_per_epoch;
    if (async_workers(c)) ic.start_index /= n;  // each worker's own position, about
    if (gather_on_device) ic.gather_device = device;
    out.pipelines.push_back(sys.spawn(input_pipeline, ic));
    replica_config rc;
    rc.index = r;
    rc.device = device;
    if (!spec.reducers.empty()) {
      rc.reducer = spec.reducers[k];
      rc.shard_optimizer = spec.shard_optimizer;
      rc.replicas = n;
      rc.reducer_cfg = reducer_config_of(c);
    }
    rc.model = c.model;
    rc.shape = {plan.train->features(), plan.train->classes};
    rc.optimizer = c.optimizer;
    rc.total_steps = plan.total_steps;
    rc.seed = c.seed;
    rc.input = out.pipelines.back();
    rc.shards = spec.shards;
    rc.place = spec.place;
    rc.local_mean = async_workers(c);
    rc.elastic = elastic(c);
    rc.period = c.strategy.communication_period;
    rc.alpha = moving_rate(c);
    rc.rho = c.strategy.rho;
    if (o.fail_replica == r) rc.fail_at_step = o.fail_at_step;
    rc.request_timeout = spec.request_timeout;
    out.replicas.push_back(sys.spawn(replica, rc));
  }
  return out;
}

}  // namespace detail

using namespace detail;

nlohmann::json run_job(const job_config& c, const job_options& o) {
  kernels::init_cpu_kernels();
  auto plan = make_plan(c, o);
  spdlog::info("job '{}': strategy {}, {} steps ({} per epoch), output {}", c.name, c.strategy.kind,
               plan->total_steps, plan->steps_per_epoch, plan->output_dir);

  system_config cfg;
  caf::actor_system sys{cfg};
  const int64_t n = c.strategy.replicas;
  shard_set shards;
  if (uses_shards(c)) {
    shards = plan_shards(c, *plan);
    std::vector<int64_t> all(static_cast<std::size_t>(c.strategy.shards));
    for (std::size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int64_t>(s);
    spawn_shards(sys, c, *plan, all, shards);
  }
  worker_spec spec;
  for (int64_t r = 0; r < n; ++r) {
    spec.indices.push_back(r);
    spec.devices.push_back(c.devices[static_cast<std::size_t>(r) % c.devices.size()]);
  }
  if (c.strategy.kind == "mirrored") {
    spec.reducers = spawn_reducer_group(sys, static_cast<int>(n), reducer_config_of(c));
    spec.shard_optimizer = c.strategy.shard_optimizer;
  }
  spec.shards = shards.actors;
  spec.place = shards.place;
  spec.start_step = plan->start_step;
  auto workers = spawn_workers(sys, c, *plan, std::move(spec), o);
  auto shard_actors = shards.actors;
  auto coord = sys.spawn(coordinator, std::shared_ptr<const job_plan>(plan), workers.replicas,
                         workers.named(), std::move(shards));

  std::string error;
  nlohmann::json summary;
  {
    caf::scoped_actor self{sys};
    self->request(coord, caf::infinite, run_atom::value)
        .receive([&](std::string& s) { summary = nlohmann::json::parse(s); },
                 [&](caf::error& e) { error = describe(e); });
    workers.stop();
    for (auto& v : shard_actors) self->send_exit(v, caf::exit_reason::user_shutdown);
    self->send_exit(coord, caf::exit_reason::user_shutdown);
  }
  auto devices = std::move(workers.devices);
  workers = {};
  shard_actors.clear();
  coord = nullptr;
  sys.await_all_actors_done();
  devices.clear();  // joins device threads after their last task
  if (!error.empty()) throw job_error(error);
  std::ofstream(fs::path(plan->output_dir) / "summary.json") << summary.dump(2) << '\n';
  return summary;
}

}  // namespace troupe
