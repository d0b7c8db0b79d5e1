#include "runtime/topology.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <thread>

#include "actors/input_pipeline.hpp"
#include "actors/partitioner.hpp"
#include "actors/replica.hpp"
#include "actors/variable_shard.hpp"
#include "collectives/process_group.hpp"
#include "kernels/optimizer.hpp"
#include "models/layer_model.hpp"
#include "models/model.hpp"
#include "monitoring/output_file.hpp"
#include "runtime/checkpointing.hpp"
#include "strategies/strategy.hpp"

namespace troupe {

namespace {
// What a model reads of the data: one example's shape and the labels.
model_shape model_shape_of(const data::dataset& d) {
  return {d.features(), d.classes, d.example_shape, d.targets()};
}

// The labels as the model's loss reads them: class labels for softmax
// cross-entropy (every model but a "layers" one with another loss); float
// targets for mse and binary cross-entropy (class labels become the class
// index, or one output per class when there are more than two).
void labels_for_loss(data::train_test& tt, const model_config& m) {
  const bool classes = m.layers.is_null() || m.loss == "softmax_cross_entropy";
  try {
    if (classes && tt.train.float_targets()) data::convert_labels(tt, data::label_kind::classes);
    if (!classes && !tt.train.float_targets())
      data::convert_labels(tt, m.loss == "binary_cross_entropy" && tt.train.classes > 2
                                   ? data::label_kind::one_hot
                                   : data::label_kind::targets);
  } catch (const data::data_error& e) {
    throw job_error(std::string("data: ") + e.what() + " (model.loss is " + m.loss +
                    (classes ? ", which needs integer class labels)" : ")"));
  }
}

}  // namespace

namespace fs = std::filesystem;

std::string output_dir_for(const job_config& c, const job_options& o) {
  if (!o.output_dir.empty()) return o.output_dir;
  if (!c.logging.output_dir.empty()) return c.logging.output_dir;
  return "runs/" + c.name;
}

std::shared_ptr<job_plan> make_plan(const job_config& c, const job_options& o, bool owner) {
  auto plan = std::make_shared<job_plan>();
  plan->config = c;
  plan->options = o;
  plan->strat = find_strategy(c.strategy.kind);
  if (!plan->strat) {
    std::string available;
    for (const auto& n : registered_strategies())
      available += (available.empty() ? "\"" : ", \"") + n + "\"";
    throw config_error("strategy.kind", "\"" + c.strategy.kind +
                                            "\" is not implemented yet in this build (available: " +
                                            available + ")");
  }
  for (std::size_t i = 0; i < c.devices.size(); ++i) {
    try {
      check_device_available(parse_device(c.devices[i]));
    } catch (const device_error& e) {
      throw job_error("devices[" + std::to_string(i) + "]: " + e.what());
    }
  }
  // A classifier's model needs a device implementation (models/model.hpp);
  // an RL strategy checks its policy itself (strategies/actor_learner.cpp).
  for (const auto& d : c.devices)
    if (plan->strat->trains_classifier() && parse_device(d).discrete() &&
        !has_device_model(c.model.kind))
      throw config_error("model.kind",
                         "\"" + c.model.kind +
                             "\" has no device implementation, so it cannot run on " + d +
                             " (register one with register_device_model, or use cpu:N)");
  plan->output_dir = output_dir_for(c, o);
  plan->owner = owner;
  plan->checkpoint_dir = c.checkpoint.dir.empty()
                             ? (fs::path(plan->output_dir) / "checkpoints").string()
                             : c.checkpoint.dir;
  std::error_code ec;
  if (owner) fs::create_directories(plan->output_dir, ec);
  if (ec)
    throw job_error("cannot create output directory '" + plan->output_dir + "': " + ec.message());

  if (plan->strat->trains_classifier()) {
    auto t0 = std::chrono::steady_clock::now();
    auto tt = data::load_data(c.data);
    spdlog::info("data: {} training and {} test examples from {} ({:.2f} s)", tt.train.size(),
                 tt.test.size(), data::data_source(c.data),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (tt.train.size() == 0) throw job_error("data: the training set is empty");
    labels_for_loss(tt, c.model);
    try {  // refused here, before any replica allocates it
      check_model_size(c.model, tt.train.features(), tt.train.classes);
    } catch (const std::invalid_argument& e) {
      throw config_error("model.hidden",
                         std::string(e.what()).substr(sizeof("model.hidden: ") - 1));
    }
    if (!c.model.layers.is_null()) check_layer_model(c.model, model_shape_of(tt.train));
    plan->train = std::make_shared<const data::dataset>(std::move(tt.train));
    plan->test = std::make_shared<const data::dataset>(std::move(tt.test));
    plan->feature_mean = std::move(tt.feature_mean);
    plan->feature_std = std::move(tt.feature_std);
    plan->steps_per_epoch = plan->strat->updates_per_epoch(c, plan->train->size());
    int64_t all_epochs = 0;
    const bool overflow =
        plan->steps_per_epoch > 0 &&
        __builtin_mul_overflow(c.training.epochs, plan->steps_per_epoch, &all_epochs);
    if (overflow && c.training.max_steps > 0) all_epochs = c.training.max_steps;
    if (overflow && c.training.max_steps == 0)
      throw config_error(
          "training.epochs",
          std::to_string(c.training.epochs) + " epochs of " +
              std::to_string(plan->steps_per_epoch) +
              " steps are more steps than can be counted; expected at most " +
              std::to_string(std::numeric_limits<int64_t>::max() / plan->steps_per_epoch));
    plan->total_steps = plan->steps_per_epoch > 0 ? all_epochs : c.training.max_steps;
    if (c.training.max_steps > 0)
      plan->total_steps = std::min(plan->total_steps, c.training.max_steps);
  } else {
    plan->total_steps = c.training.max_steps;  // updates; 0: the job stops on other grounds
  }

  if (!owner) return plan;
  prepare_checkpoints(*plan);
  write_job_file((fs::path(plan->output_dir) / "config.json").string(), to_json(c).dump(2) + '\n');
  return plan;
}

void write_job_file(const std::string& path, const std::string& text) {
  try {
    monitoring::write_output_file(path, text);
  } catch (const monitoring::output_file_error& e) {
    throw job_error(std::string("cannot write ") + e.what());
  }
}

void check_model_against_data(const job_config& c) {
  auto strat = find_strategy(c.strategy.kind);
  if (c.model.layers.is_null() || !strat || !strat->trains_classifier()) return;
  data::train_test tt;
  try {
    tt = data::load_data(c.data);
  } catch (const data::data_error& e) {
    throw job_error(std::string("data: ") + e.what());
  }
  labels_for_loss(tt, c.model);
  check_layer_model(c.model, model_shape_of(tt.train));
}

uint64_t model_state_bytes(const job_plan& plan) {
  if (!plan.train) return 0;
  auto net = create_model(plan.config.model, model_shape_of(*plan.train), plan.config.seed);
  uint64_t elements = 0;
  for (const auto& v : net->variables()) elements += static_cast<uint64_t>(v.value.numel());
  return 4 * elements;
}

shard_set plan_shards(const job_plan& plan) {
  const auto& c = plan.config;
  if (!plan.strat->has_variable_shards()) return {};
  auto net = create_model(c.model, model_shape_of(*plan.train), c.seed);
  std::vector<variable_desc> descs;
  for (const auto& v : net->variables()) descs.push_back({v.name, v.value.shape(), v.value.type()});
  shard_set out;
  try {
    out.place = partition_variables(descs, c.strategy.shards, c.strategy.partitioner);
  } catch (const std::invalid_argument& e) {
    throw job_error(e.what());
  }
  auto sc = plan.strat->shard_config(c, plan.total_steps);
  out.slot_suffixes = kernels::optimizer(sc.optimizer, plan.total_steps).slot_names();
  return out;
}

void spawn_shards(caf::actor_system& sys, const job_plan& plan, const std::vector<int64_t>& indices,
                  shard_set& set) {
  const auto& c = plan.config;
  // The model's initial variables (the same seed as every other strategy),
  // split over the shards.
  auto net = create_model(c.model, model_shape_of(*plan.train), c.seed);
  auto pieces = split_for_shards(net->variables(), set.place, c.strategy.shards);
  for (int64_t s : indices) {
    auto sc = plan.strat->shard_config(c, plan.total_steps);
    sc.index = s;
    sc.pieces = std::move(pieces[static_cast<std::size_t>(s)]);
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

gather_place gather_place_for(const std::string& gather, bool lockstep,
                              const std::vector<std::string>& devices, bool device_collectives) {
  if (gather == "device") return gather_place::device;
  if (gather == "step") return gather_place::step;
  if (gather != "auto") return gather_place::pipeline;
  if (device_collectives) {
    // A discrete device's thread drives the accelerator: rows copied there
    // would delay its launches.
    const bool host = std::all_of(devices.begin(), devices.end(),
                                  [](const std::string& d) { return !parse_device(d).discrete(); });
    return host ? gather_place::step : gather_place::pipeline;
  }
  std::set<std::string> threads(devices.begin(), devices.end());
  return lockstep && static_cast<int64_t>(threads.size()) >= usable_cpu_cores()
             ? gather_place::device
             : gather_place::pipeline;
}

namespace {

// Synchronised batch norm: the process's replicas of a lockstep strategy
// all-reduce their statistics in one group on their devices. Across
// processes each process's replicas form their own group.
std::shared_ptr<group_rendezvous> statistics_group(const job_config& c, const strategy& strat,
                                                   const std::vector<std::string>& devices) {
  if (!strat.lockstep() || devices.size() < 2 || !uses_synced_statistics(c.model)) return nullptr;
  // Each rank blocks its device's thread in the collective: two replicas on
  // one device would wait for each other forever.
  for (std::size_t a = 0; a < devices.size(); ++a)
    for (std::size_t b = a + 1; b < devices.size(); ++b)
      if (devices[a] == devices[b]) {
        spdlog::warn("batch_norm sync: replicas share {}, so each normalises with its own batch",
                     devices[a]);
        return nullptr;
      }
  try {
    return make_device_rendezvous(static_cast<int>(devices.size()), parse_device(devices.front()));
  } catch (const std::exception& e) {
    spdlog::warn("batch_norm sync: {}; each replica normalises with its own batch", e.what());
    return nullptr;
  }
}

// The device thread of the process's k-th replica: one per device, or, where
// the strategy's replicas wait on their device threads for each other, one
// per replica (a second replica on "cpu:0" runs on "cpu:0#1").
std::string device_thread_name(const strategy& strat, const std::vector<std::string>& devices,
                               std::size_t k) {
  if (!strat.replicas_wait_on_device()) return devices[k];
  const auto before =
      std::count(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(k), devices[k]);
  return before == 0 ? devices[k] : devices[k] + "#" + std::to_string(before);
}

}  // namespace

worker_parts spawn_workers(caf::actor_system& sys, const job_plan& plan, worker_spec spec) {
  const auto& c = plan.config;
  const auto& strat = *plan.strat;
  worker_parts out;
  out.indices = spec.indices;
  reducer_wiring rw;
  rw.local_replicas = static_cast<int>(spec.indices.size());
  rw.ring = spec.ring;
  rw.ring_tasks = spec.ring_tasks;
  rw.device_group_id = spec.device_group_id;
  auto reducers = strat.make_reducers(sys, c, rw);
  out.reducers = reducers.per_replica;
  if (reducers.device_group)  // each rank blocks its device thread in a collective
    for (std::size_t a = 0; a < spec.devices.size(); ++a)
      for (std::size_t b = a + 1; b < spec.devices.size(); ++b)
        if (spec.devices[a] == spec.devices[b])
          throw config_error("strategy.reducer.algorithm",
                             "\"device\" needs one device per replica, but replicas " +
                                 std::to_string(spec.indices[a]) + " and " +
                                 std::to_string(spec.indices[b]) + " share " + spec.devices[a]);
  const auto gather = gather_place_for(c.data.gather, strat.lockstep(), spec.devices,
                                       static_cast<bool>(reducers.device_group));
  const auto input = strat.input(c, spec.start_step, plan.steps_per_epoch);
  const auto stats_group = statistics_group(c, strat, spec.devices);
  // The training set may live on the devices: their pipelines then plan
  // batches without gathering them (a step that falls back gathers its own).
  const bool resident =
      strat.runs_on_resident_data() && c.data.placement != "host" &&
      std::all_of(spec.devices.begin(), spec.devices.end(),
                  [](const std::string& d) { return parse_device(d).discrete(); });
  for (std::size_t k = 0; k < spec.indices.size(); ++k) {
    const int64_t r = spec.indices[k];
    const auto& dev = spec.devices[k];
    // The process's devices share their background work (the gathers).
    auto device = out.devices.get(device_thread_name(strat, spec.devices, k));
    input_pipeline_config ic;
    ic.data = plan.train;
    ic.global_batch = input.global_batch;
    ic.steps_per_update = c.strategy.steps_per_update;
    ic.shuffle = c.data.shuffle;
    ic.seed = c.seed;
    ic.prefetch = c.data.prefetch;
    ic.context = {1, 0, c.strategy.replicas};
    ic.replica = r;
    ic.start_epoch = input.start_epoch;
    ic.start_index = input.start_index;
    if (gather == gather_place::device && !resident) ic.gather_device = device;
    ic.gather_in_step = gather == gather_place::step || resident;
    out.pipelines.push_back(sys.spawn(input_pipeline, ic));
    replica_wiring w;
    w.index = r;
    w.replicas = c.strategy.replicas;
    if (!out.reducers.empty()) w.reducer = out.reducers[k];
    w.local_index = static_cast<int64_t>(k);
    w.device_group = reducers.device_group;
    w.device_group_global = reducers.device_group_global;
    // The process's first replica holds the group across processes (the
    // hierarchical composite's second group).
    if (!w.device_group_global && k == 0) {
      w.ring = spec.ring;
      if (w.device_group) w.process_links = spec.process_links;
    }
    w.shards = spec.shards;
    w.place = spec.place;
    w.across_processes = spec.ring_tasks.size() > 1;
    w.local_replicas = static_cast<int64_t>(spec.indices.size());
    w.processes = std::max<int64_t>(1, static_cast<int64_t>(spec.ring_tasks.size()));
    w.process_rank = spec.ring_rank;
    w.request_timeout = spec.request_timeout;
    w.bucket_bytes = c.strategy.reducer.bucket_bytes;
    replica_config rc;
    rc.index = r;
    rc.device = device;
    rc.device_kind = parse_device(dev);
    rc.model = c.model;
    rc.shape = model_shape_of(*plan.train);
    if (stats_group) {
      rc.statistics_group = stats_group;
      rc.statistics_rank = static_cast<int>(k);
    }
    rc.optimizer = c.optimizer;
    rc.total_steps = plan.total_steps;
    rc.seed = c.seed;
    rc.input = out.pipelines.back();
    rc.step = strat.make_replica_step(c, w);
    rc.fail_at_step = faults_or_none(plan.options.faults).fail_replica.at_for(r);
    rc.request_timeout = spec.request_timeout;
    if (resident) {
      rc.placement = c.data.placement;
      rc.resident_images = plan.train->images;
      rc.resident_labels = plan.train->labels;
      rc.batch_rows = input.global_batch;
    }
    rc.step_graphs = c.training.step_graphs != "off";
    rc.tf32 = {c.training.tf32 != "off", c.training.tf32 == "all"};
    out.replicas.push_back(spawn_replica(sys, rc));
  }
  return out;
}

worker_parts spawn_job_workers(caf::actor_system& sys, std::shared_ptr<const job_plan> plan,
                               worker_spec spec, const caf::message& hub) {
  if (plan->strat->own_job()) return plan->strat->spawn_own_workers(sys, plan, spec, hub);
  return spawn_workers(sys, *plan, std::move(spec));
}

void job_actors::stop(const std::vector<caf::actor>& also) const {
  workers.stop();
  if (hub) hub->stop();
  for (auto& s : shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  for (auto& a : also)
    if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

void job_actors::join(caf::actor_system& sys) {
  auto devices = std::move(workers.devices);
  auto keep_hub = std::move(hub);
  workers = {};
  shards.clear();
  sys.await_all_actors_done();
  devices.clear();   // joins the device threads after their last task
  keep_hub.reset();  // the hub's devices, likewise
}

}  // namespace troupe
