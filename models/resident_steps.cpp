#include "models/resident_steps.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace troupe {

resident_steps::resident_steps(model& net, int64_t set_size, kernels::optimizer& opt,
                               std::shared_ptr<device_context> dev,
                               std::vector<std::vector<float*>> slots, options o)
    : net_(net),
      opt_(opt),
      dev_(std::move(dev)),
      slots_(std::move(slots)),
      opts_(std::move(o)),
      set_size_(set_size) {
  std::string why;
  scheduled_ = opt_.capturable(&why);
  capture_ = scheduled_ && net_.capturable(&why);
  if (capture_ && !opts_.graphs) {
    capture_ = false;
    why = "training.step_graphs is \"off\"";
  }
  if (!capture_) say("steps run uncaptured: " + why);
  counter_ = dev_->allocate(2 * sizeof(int64_t));
}

std::vector<batch_stats> resident_steps::run(const std::vector<step>& steps) {
  if (steps.empty()) return {};
  const auto n = static_cast<int64_t>(steps.size());
  begin_execution(steps);
  for (const auto& s : steps) {
    const int64_t rows = s.rows->numel();
    const float scale = s.global_size > 0 ? 1.0f / static_cast<float>(s.global_size) : 0.0f;
    run_step(rows, scale);
  }
  std::vector<double> loss(steps.size());
  std::vector<int64_t> correct(steps.size());
  dev_->copy_to_host(loss.data(), loss_out_.data(), loss.size() * sizeof(double));
  dev_->copy_to_host(correct.data(), correct_out_.data(), correct.size() * sizeof(int64_t));
  if (scheduled_) opt_.advance(n);
  std::vector<batch_stats> out(steps.size());
  for (std::size_t k = 0; k < steps.size(); ++k)
    out[k] = {loss[k], correct[k], steps[k].rows->numel()};
  return out;
}

resident_steps::warm_up_times resident_steps::warm_up(int64_t rows, int64_t global_size) {
  warm_up_times times;
  rows = std::min(rows, set_size_);
  if (rows < 1 || global_size < 1) return times;
  auto last = std::chrono::steady_clock::now();
  const auto lap = [&last] {
    const auto now = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::milli>(now - std::exchange(last, now)).count();
  };
  tensor ids({rows}, dtype::i64);
  for (int64_t r = 0; r < rows; ++r) ids.data<int64_t>()[r] = r;
  const std::vector<step> steps{{&ids, global_size}};
  // Room for the largest execution of such steps: the buffers a graph
  // holds are not replaced later.
  const auto most = static_cast<std::size_t>(training_config::kMaxStepsPerExecution);
  grow(plan_, most * static_cast<std::size_t>(1 + rows) * sizeof(int64_t));
  grow(loss_out_, most * sizeof(double));
  grow(correct_out_, most * sizeof(int64_t));
  net_.variables_to_host();  // the host copies, to put back after
  begin_execution(steps);
  const float scale = 1.0f / static_cast<float>(global_size);
  auto& g = graphs_[{rows, scale}];
  body(rows, scale);
  dev_->synchronize();
  times.step = lap();
  ++g.seen;
  if (capture_) capture_step(g, rows, scale);  // captured, not launched
  times.capture = lap();
  net_.variables_to_device();
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    const auto host = opt_.slot_tensors(k);
    for (std::size_t i = 0; i < host.size(); ++i)
      dev_->copy_to_device(slots_[k][i], host[i].raw(), host[i].nbytes());
  }
  if (!scheduled_) opt_.advance(-1);  // apply_on counted the step
  dev_->synchronize();
  requests_seen_ = dev_->memory_stats().requests;
  times.restore = lap();
  return times;
}

// What an execution's steps read, written before them: the plan, the
// schedule's table (all of training, so it is not regrown mid-way), room for
// their figures, the counter at the optimizer's step, the sums at zero.
void resident_steps::begin_execution(const std::vector<step>& steps) {
  const auto n = static_cast<int64_t>(steps.size());
  const int64_t first = opt_.step();
  write_plan(steps);
  if (scheduled_) ensure_table(std::max(first + n, opt_.total_steps()));
  grow(loss_out_, static_cast<std::size_t>(n) * sizeof(double));
  grow(correct_out_, static_cast<std::size_t>(n) * sizeof(int64_t));
  const int64_t counter[2] = {first, first};
  dev_->copy_to_device(counter_.data(), counter, sizeof counter);
  zero_sums();
}

// plan = [where each step's rows begin in plan] [the rows, step after step]
void resident_steps::write_plan(const std::vector<step>& steps) {
  host_plan_.assign(steps.size(), 0);
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const tensor& r = *steps[k].rows;
    if (r.type() != dtype::i64 || r.rank() != 1 || r.numel() == 0)
      throw std::invalid_argument("resident step " + std::to_string(k) +
                                  ": expected the rows' indices as a non-empty int64 [b]");
    host_plan_[k] = static_cast<int64_t>(host_plan_.size());
    const int64_t* ids = r.data<int64_t>();
    for (int64_t i = 0; i < r.numel(); ++i)
      if (ids[i] < 0 || ids[i] >= set_size_)
        throw std::out_of_range("resident step " + std::to_string(k) + ": row " +
                                std::to_string(ids[i]) + " outside the data set's " +
                                std::to_string(set_size_) + " rows");
    host_plan_.insert(host_plan_.end(), ids, ids + r.numel());
  }
  const std::size_t bytes = host_plan_.size() * sizeof(int64_t);
  grow(plan_, bytes);
  dev_->copy_to_device(plan_.data(), host_plan_.data(), bytes);
}

void resident_steps::ensure_table(int64_t steps) {
  if (steps <= table_steps_) return;
  // Room to spare: each regrowth drops the graphs.
  const int64_t want = std::max<int64_t>(steps, 2 * table_steps_ + 1024);
  const auto t = opt_.schedule_table(0, want);
  grow(table_, t.size() * sizeof(float));
  dev_->copy_to_device(table_.data(), t.data(), t.size() * sizeof(float));
  table_steps_ = want;
}

void resident_steps::grow(device_buffer& b, std::size_t bytes) {
  if (b.bytes() >= bytes) return;
  graphs_.clear();  // they hold the old buffer's address
  b = dev_->allocate(std::max(bytes, 2 * b.bytes()));
}

// A graph holds the addresses of every buffer its step used. Any request of
// the device's allocator since the last step may have replaced one of them
// (an evaluation growing the layers' outputs, a fallback step) or handed a
// freed one to another: the graphs are then captured again.
void resident_steps::run_step(int64_t rows, float scale) {
  if (dev_->memory_stats().requests != requests_seen_) graphs_.clear();
  step_as_needed(rows, scale);
  requests_seen_ = dev_->memory_stats().requests;
}

void resident_steps::step_as_needed(int64_t rows, float scale) {
  auto& g = graphs_[{rows, scale}];
  if (!g.graph && capture_ && !g.failed && g.seen++ > 0) capture_step(g, rows, scale);
  if (g.graph) {
    g.graph->launch();
    ++counts_.replays;
    return;
  }
  body(rows, scale);
  ++counts_.uncaptured;
}

void resident_steps::capture_step(shape_graph& g, int64_t rows, float scale) {
  try {
    g.graph = dev_->capture([&] { body(rows, scale); });
  } catch (const std::exception& e) {
    g.failed = true;
    say("a step of " + std::to_string(rows) + " rows could not be captured (" + e.what() +
        "); such steps run uncaptured");
    return;
  }
  if (!g.graph) {
    g.failed = true;
    say("the device has no graphs; steps run uncaptured");
    return;
  }
  ++counts_.graphs;
  counts_.operations = g.graph->operations();
}

void resident_steps::body(int64_t rows, float scale) {
  const auto* counter = counter_.as<int64_t>();
  net_.train_planned(plan_.as<int64_t>(), counter, rows, scale);
  auto [loss, correct] = net_.device_stats();
  update();
  dev_->ops().record_step_stats(loss, correct, counter_.as<int64_t>(), loss_out_.as<double>(),
                                correct_out_.as<int64_t>());
}

// The model adds each step's sums; record_step_stats zeroes them after.
void resident_steps::zero_sums() {
  auto [loss, correct] = net_.device_stats();
  dev_->ops().fill_stats(loss, correct);
}

void resident_steps::update() {
  const auto g = net_.device_gradients();
  const std::vector<const float*> grads(g.begin(), g.end());
  if (scheduled_)
    opt_.apply_scheduled(dev_->ops(), net_.device_variables(), grads, slots_, table_.f32(),
                         counter_.as<int64_t>());
  else
    opt_.apply_on(dev_->ops(), net_.device_variables(), grads, slots_);
}

}  // namespace troupe
