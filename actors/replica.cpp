#include "actors/replica.hpp"
#include "actors/failure.hpp"
#include "actors/visible_mailbox.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/optimizer.hpp"

namespace troupe {
namespace {
// slots[k][i]: where slot k of variable i lives on the device.
std::vector<std::vector<float*>> slot_pointers(
    const std::vector<std::vector<device_buffer>>& device_slots) {
  std::vector<std::vector<float*>> slots;
  for (const auto& per_var : device_slots) {
    slots.emplace_back();
    for (const auto& b : per_var) slots.back().push_back(b.f32());
  }
  return slots;
}
}  // namespace

step_stats compute_gradients(compute_state& cs, const batch& b, int64_t step, int64_t fail_at_step,
                             bool local_mean, model::gradients_ready_fn on_ready) {
  if (step == fail_at_step)
    throw std::runtime_error("injected failure at step " + std::to_string(step));
  b.fill_rows();  // data.gather "step": here, on the device that reads them
  int64_t n = b.global_size;
  if (local_mean) {
    n = 0;
    for (const auto& x : b.x) n += x.empty() ? 0 : x.dim(0);
  }
  float scale = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
  step_stats s;
  s.step = step;
  s.lr = cs.opt->current_lr();
  // The hook only while the last micro-batch runs: before it, no gradient
  // is final. Cleared however train_batch ends.
  struct hook_guard {
    model& net;
    ~hook_guard() { net.set_gradients_ready({}); }
  } guard{*cs.net};
  for (std::size_t m = 0; m < b.x.size(); ++m) {
    if (on_ready && m + 1 == b.x.size()) cs.net->set_gradients_ready(on_ready);
    cs.net->set_step(step, m < b.ids.size() ? &b.ids[m] : nullptr);
    auto r = cs.net->train_batch(b.x[m], b.y[m], scale, cs.grads, m > 0);
    s.loss_sum += r.loss_sum;
    s.correct += r.correct;
    s.count += r.count;
  }
  return s;
}

void compute_state::place_optimizer() {
  device_slots.clear();
  if (!discrete()) return;
  for (std::size_t k = 0; k < opt->slot_names().size(); ++k) {
    std::vector<device_buffer> per_var;
    for (const auto& t : opt->slot_tensors(k)) per_var.push_back(dev->allocate(t.nbytes()));
    device_slots.push_back(std::move(per_var));
  }
  slots_to_device();
}

void compute_state::settle_variables() {
  if (auto* group = std::exchange(variables_in_flight, nullptr)) group->complete();
}

void compute_state::slots_to_host() {
  for (std::size_t k = 0; k < device_slots.size(); ++k) {
    auto host = opt->slot_tensors(k);  // shared buffers: the optimizer's own
    for (std::size_t i = 0; i < host.size(); ++i)
      dev->copy_to_host(host[i].raw(), device_slots[k][i].data(), host[i].nbytes());
  }
}

void compute_state::slots_to_device() {
  for (std::size_t k = 0; k < device_slots.size(); ++k) {
    auto host = opt->slot_tensors(k);
    for (std::size_t i = 0; i < host.size(); ++i)
      dev->copy_to_device(device_slots[k][i].data(), host[i].raw(), host[i].nbytes());
  }
}

void compute_state::apply_update() {
  if (!discrete()) {
    opt->apply(net->variables(), grads);
    return;
  }
  auto g = net->device_gradients();
  opt->apply_on(dev->ops(), net->device_variables(), {g.begin(), g.end()},
                slot_pointers(device_slots));
}

std::vector<tensor> variable_buffers(compute_state& cs) {
  std::vector<tensor> out;
  for (auto& v : cs.net->variables()) out.push_back(v.value);
  return out;
}

namespace {
using self_ptr = replica_actor::stateful_pointer<replica_state>;

// Ends the replica with a device task's error, naming it.
void fail(self_ptr self, const std::string& why) {
  const auto who = "replica " + std::to_string(self->state.cfg.index);
  spdlog::error("{}: {}", who, why);
  self->quit(caf::make_error(caf::sec::runtime_error, who + ": " + why));
}

void try_start(self_ptr self);
void start_waiting(self_ptr self);
void prefetch_next(self_ptr self);
void request_batches(self_ptr self);

// The replica's track in a timeline trace shows, at every moment, the one
// thing it is doing or waiting for, so that its spans cover its whole life:
// a collective or a shard's reply; else the device task it waits for; else,
// inside a step, a reply it waits for; else a batch for a requested step;
// else the next step (its peers, in a synchronous strategy).
void show_activity(self_ptr self) {
  if (!trace::enabled()) return;
  auto& st = self->state;
  if (st.communicating)
    st.track.set(st.communicating, trace::category::communicate, st.current_step);
  else if (const char* task = st.tasks->oldest_span())
    st.track.set(task, trace::category::compute, st.current_step);
  else if (st.busy)
    st.track.set("wait_for_reply", trace::category::wait, st.current_step);
  else if (!st.waiting_steps.empty())
    st.track.set("wait_for_batch", trace::category::wait, st.waiting_steps.front().first);
  else
    st.track.set("wait_for_step", trace::category::wait);
}
}  // namespace

class replica_host_impl final : public replica_host {
 public:
  explicit replica_host_impl(self_ptr self) : self_(self) {}
  replica_actor::pointer self() override { return self_; }
  int64_t index() const override { return self_->state.cfg.index; }
  caf::duration request_timeout() const override { return self_->state.cfg.request_timeout; }
  int64_t fail_at_step() const override { return self_->state.cfg.fail_at_step; }
  const std::vector<tensor>& gradient_buffers() const override { return self_->state.grad_buffers; }

  void submit(const char* span, std::function<void(compute_state&)> work,
              std::function<void()> then) override {
    auto settled = [work = std::move(work)](compute_state& cs) {
      cs.settle_variables();
      work(cs);
    };
    submit_reading_no_variables(span, std::move(settled), std::move(then));
  }
  // The same without settling: for a task that reads no variables (the
  // batch prefetch), so that an all-gather of them stays in flight
  // (compute_state::variables_in_flight).
  void submit_reading_no_variables(const char* span, std::function<void(compute_state&)> work,
                                   std::function<void()> then) {
    auto& st = self_->state;
    st.tasks->submit(self_, span, std::move(work), std::move(then), {st.current_step, -1, -1});
    show_activity(self_);
  }

  void count(const step_stats& s) override {
    auto& m = self_->state.train_metrics;
    m.loss_sum += s.loss_sum;
    m.correct += s.correct;
    m.count += s.count;
  }
  // A step that sets busy goes on to submit or communicate at once, which
  // shows; showing "wait_for_reply" in between would only add a sliver.
  void set_busy(bool busy) override {
    self_->state.busy = busy;
    if (!busy) show_activity(self_);
  }
  void resume() override {
    self_->state.busy = false;
    try_start(self_);
    show_activity(self_);
  }
  void communicating(const char* what) override {
    auto& st = self_->state;
    st.communicating = what;
    trace::note_step(st.cfg.index, st.current_step);
    show_activity(self_);
  }
  // The reply's continuation goes on to submit, communicate or finish the
  // step, each of which shows what comes next.
  void communicated() override { self_->state.communicating = nullptr; }
  void fail(const caf::error& e) override { self_->quit(e); }

 private:
  self_ptr self_;
};

replica_state::replica_state() = default;
replica_state::~replica_state() {
  if (cfg.statistics_group) cfg.statistics_group->abort(replica_stopped(cfg.index));
}

namespace {

void request_batches(self_ptr self) {
  auto& st = self->state;
  // Keep one batch ahead per waiting step plus one spare.
  int64_t want = 1;
  for (const auto& w : st.waiting_steps) want += w.count;
  while (st.batches_requested + static_cast<int64_t>(st.batches.size()) < want) {
    ++st.batches_requested;
    self->request(st.cfg.input, st.cfg.request_timeout, next_atom::value)
        .then(
            [self](batch& b) {
              --self->state.batches_requested;
              self->state.batches.push_back(std::move(b));
              try_start(self);
              prefetch_next(self);
              show_activity(self);
            },
            [self](caf::error& e) { self->quit(e); });
  }
}

// On a discrete device, the batch the next step will take starts its copy
// to the device now, so that it overlaps the step the device runs next
// (the model matches it to that step's batch by its buffers).
void prefetch_next(self_ptr self) {
  auto& s = self->state;
  if (!s.cfg.device_kind.discrete() || s.batches.empty()) return;
  const batch& b = s.batches.front();
  if (b.x.empty() || b.x.front().raw() == s.prefetched) return;
  s.prefetched = b.x.front().raw();
  s.host->submit_reading_no_variables(
      "prefetch_batch",
      [b](compute_state& cs) {
        if (cs.resident) return;  // its steps gather on the device
        b.fill_rows();
        for (std::size_t m = 0; m < b.x.size(); ++m) cs.net->prefetch(b.x[m], b.y[m]);
      },
      [] {});
}

void try_start(self_ptr self) {
  auto& s = self->state;
  while (!s.busy && !s.waiting_steps.empty() &&
         static_cast<int64_t>(s.batches.size()) >= s.waiting_steps.front().count) {
    auto w = std::move(s.waiting_steps.front());
    s.waiting_steps.pop_front();
    std::vector<batch> next;
    for (int64_t i = 0; i < w.count; ++i) {
      next.push_back(std::move(s.batches.front()));
      s.batches.pop_front();
    }
    prefetch_next(self);
    s.current_step = w.first;
    // Messages fetched into the actor's queue and not yet handled. Not
    // mailbox().size(): its fetch_more() downcasts CAF 0.17's queue sentinel,
    // which UBSan reports; what CAF has not fetched yet goes uncounted.
    if (trace::enabled())
      trace::counter(s.track.id(), "mailbox_depth",
                     static_cast<double>(self->mailbox().queue().total_task_size()));
    if (w.count == 1)
      s.cfg.step->run(*s.host, w.first, std::move(next.front()), std::move(w.one));
    else
      s.cfg.step->run_steps(*s.host, w.first, std::move(next), std::move(w.steps));
    request_batches(self);
  }
}

// Steps [first, first + count) wait for their batches: as one execution
// where the strategy's step runs executions, else one step at a time, each
// filling its place in the answer.
void enqueue_steps(self_ptr self, int64_t first, int64_t count, execution_promise rp) {
  auto& s = self->state;
  if (count > 1 && s.cfg.step->runs_executions()) {
    s.waiting_steps.push_back({first, count, {}, std::move(rp)});
    return;
  }
  struct answer {
    std::vector<step_stats> steps;
    int64_t left;
    execution_promise rp;
  };
  auto a = std::make_shared<answer>(
      answer{std::vector<step_stats>(static_cast<std::size_t>(count)), count, std::move(rp)});
  for (int64_t i = 0; i < count; ++i)
    s.waiting_steps.push_back({first + i,
                               1,
                               step_promise([a, i](const step_stats& st) {
                                 a->steps[static_cast<std::size_t>(i)] = st;
                                 if (--a->left == 0) a->rp(a->steps);
                               }),
                               {}});
}

void start_waiting(self_ptr self) {
  try_start(self);
  request_batches(self);
  show_activity(self);
}

// Where a replica's build goes, for the one line that says so: what the
// first step waits for.
class phase_clock {
 public:
  void mark(const char* what) {
    const auto now = std::chrono::steady_clock::now();
    parts_.emplace_back(what, millis(now - last_));
    last_ = now;
  }
  // What the last part was made of.
  void detail(std::string what) { details_[parts_.size() - 1] = std::move(what); }
  std::string summary() const {
    double total = 0;
    std::string list;
    for (std::size_t k = 0; k < parts_.size(); ++k) {
      total += parts_[k].second;
      list += (list.empty() ? "" : ", ") + std::string(parts_[k].first) + " " +
              fmt::format("{:.1f}", parts_[k].second);
      if (auto d = details_.find(k); d != details_.end()) list += " (" + d->second + ")";
    }
    return fmt::format("{:.1f} ms ({})", total, list);
  }

 private:
  static double millis(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  }
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::vector<std::pair<const char*, double>> parts_;
  std::map<std::size_t, std::string> details_;
};

// data.placement: the training set uploaded to the replica's device once,
// and the steps that run on it, where the device has the room ("auto": half
// its free memory) and the model can take it; a line says which and why.
void place_data_set(compute_state& cs, const replica_config& c, phase_clock& clock) {
  const auto who = "replica " + std::to_string(c.index);
  const auto mb = [](std::size_t b) { return std::to_string((b + (1u << 19)) >> 20) + " MB"; };
  const std::size_t bytes = c.resident_images.nbytes() + c.resident_labels.nbytes();
  const auto free = cs.dev->free_memory();
  if (c.placement == "auto" && free && bytes > *free / 2) {
    spdlog::info(
        "{}: data.placement auto: host (the training set's {} is more than half of the {} "
        "free on {})",
        who, mb(bytes), mb(*free), c.device_kind.str());
    return;
  }
  const bool attached = cs.net->attach_dataset(c.resident_images, c.resident_labels);
  clock.mark("data set upload");
  if (!attached) {
    if (c.placement == "device")
      throw std::runtime_error("data.placement \"device\": the model on " + c.device_kind.str() +
                               " cannot hold the training set");
    spdlog::info("{}: data.placement auto: host (the model cannot hold the training set)", who);
    return;
  }
  auto slots = slot_pointers(cs.device_slots);
  resident_steps::options o;
  o.graphs = c.step_graphs;
  o.note = [who](const std::string& line) { spdlog::info("{}: {}", who, line); };
  cs.resident = std::make_unique<resident_steps>(*cs.net, c.resident_images.dim(0), *cs.opt, cs.dev,
                                                 std::move(slots), std::move(o));
  const auto warm = cs.resident->warm_up(c.batch_rows, c.batch_rows);
  clock.mark("warm-up");
  clock.detail(fmt::format("step {:.1f}, capture {:.1f}, restore {:.1f}", warm.step, warm.capture,
                           warm.restore));
  spdlog::info(
      "{}: data.placement {}: the training set ({}) is on {}; each step gathers its rows "
      "there{}",
      who, c.placement, mb(bytes), c.device_kind.str(),
      cs.resident->captures() ? " and replays as a captured graph" : "");
}

// Replaces the model's variables and the optimizer's slots (on the device).
int64_t restore_state(compute_state& cs, const model_state& ms) {
  // Buffers alone (the replicas of a sharded strategy, whose shards hold
  // the variables): the variables stay as they are.
  if (ms.variables.empty()) {
    cs.variables_to_host();
    restore_buffers(cs.net->buffers(), ms.buffers);
    cs.variables_to_device();
    return 0;
  }
  auto step = restore_variables_and_slots(cs.net->variables(), *cs.opt, ms.variables, ms.slots);
  restore_buffers(cs.net->buffers(), ms.buffers);
  cs.variables_to_device();
  cs.slots_to_device();
  return step;
}

// Builds the model, its optimizer and step on the device thread (its memory
// is first touched there); the gradient buffers, shared with the reducer.
std::vector<tensor> build_model(const replica_config& c, compute_state& cs) {
  phase_clock clock;
  cs.dev = make_device_context(c.device_kind);
  cs.dev->ops().use_tf32(c.tf32);
  clock.mark("device");
  cs.net = create_model_on(c.model, c.shape, c.seed, cs.dev);
  clock.mark("model");
  cs.opt = std::make_unique<kernels::optimizer>(c.optimizer, c.total_steps);
  cs.opt->init(cs.net->variables());
  cs.place_optimizer();
  cs.grads = cs.net->make_gradients();
  if (c.statistics_group) {
    cs.statistics = c.statistics_group->join(c.statistics_rank, *cs.dev);
    cs.net->set_statistics_group(cs.statistics.get());
  }
  c.step->init(cs);
  clock.mark("optimizer and step");
  if (c.placement != "host") place_data_set(cs, c, clock);
  spdlog::log(
      c.device_kind.kind == device_spec::kind_t::cpu ? spdlog::level::debug : spdlog::level::info,
      "replica {}: built on {} in {}", c.index, c.device_kind.str(), clock.summary());
  std::vector<tensor> buffers;
  for (auto& g : cs.grads) buffers.push_back(g.value);
  return buffers;
}

// Evaluates on the device thread. The model under test may be another's
// (the shards', through `install`): this replica's own variables come back
// after.
metric_sums evaluate_on(compute_state& cs, const tensor& x, const tensor& y,
                        const std::function<void(compute_state&)>& install) {
  auto& vars = cs.net->variables();
  if (install) cs.variables_to_host();
  std::vector<tensor> own = variable_buffers(cs);
  if (install) {
    install(cs);
    cs.variables_to_device();
  }
  auto r = cs.net->evaluate(x, y);
  for (std::size_t i = 0; i < vars.size(); ++i) vars[i].value = own[i];
  if (install) cs.variables_to_device();
  return metric_sums{r.loss_sum, r.correct, r.count};
}

// The variables, slots and buffers, copied to the host.
model_state snapshot(compute_state& cs) {
  cs.variables_to_host();
  cs.slots_to_host();
  model_state ms;
  for (auto& v : cs.net->variables()) ms.variables.push_back({v.name, v.value.clone()});
  ms.slots = cs.opt->state();
  for (auto& b : cs.net->buffers()) ms.buffers.push_back({b.name, b.value.clone()});
  return ms;
}

// The replica's handlers, one per message; replica() wires them.

caf::result<step_stats> on_train_step(self_ptr self, int64_t step) {
  auto rp = self->make_response_promise<step_stats>();
  self->state.waiting_steps.push_back(
      {step, 1, step_promise([rp](const step_stats& s) mutable { rp.deliver(s); }), {}});
  start_waiting(self);
  return rp;
}

caf::result<std::vector<step_stats>> on_train_steps(self_ptr self, int64_t first, int64_t count) {
  if (count < 1 || count > training_config::kMaxStepsPerExecution)
    return caf::make_error(caf::sec::invalid_argument,
                           "train: expected 1 to " +
                               std::to_string(training_config::kMaxStepsPerExecution) +
                               " steps, got " + std::to_string(count));
  auto rp = self->make_response_promise<std::vector<step_stats>>();
  enqueue_steps(self, first, count,
                [rp](std::vector<step_stats>& all) mutable { rp.deliver(all); });
  start_waiting(self);
  return rp;
}

caf::result<metric_sums> on_eval(self_ptr self, tensor x, tensor y) {
  auto rp = self->make_response_promise<metric_sums>();
  auto& st = self->state;
  st.cfg.step->eval_variables(*st.host, [self, rp, x = std::move(x), y = std::move(y)](
                                            std::function<void(compute_state&)> install) mutable {
    self->state.host->on_device<metric_sums>(
        "evaluate",
        [x, y, install = std::move(install)](compute_state& cs) {
          return evaluate_on(cs, x, y, install);
        },
        [rp](metric_sums& m) mutable { rp.deliver(m); });
  });
  return rp;
}

caf::result<model_state> on_state(self_ptr self) {
  auto rp = self->make_response_promise<model_state>();
  auto& st = self->state;
  st.cfg.step->before_snapshot(*st.host, [self, rp]() mutable {
    self->state.host->on_device<model_state>(
        "snapshot", [](compute_state& cs) { return snapshot(cs); },
        [rp](model_state& ms) mutable { rp.deliver(std::move(ms)); });
  });
  return rp;
}

caf::result<int64_t> on_restore(self_ptr self, model_state ms) {
  auto rp = self->make_response_promise<int64_t>();
  self->state.host->on_device<int64_t>(
      "restore", [ms = std::move(ms)](compute_state& cs) { return restore_state(cs, ms); },
      [rp](int64_t& step) mutable { rp.deliver(step); });
  return rp;
}

}  // namespace

replica_actor::behavior_type replica(self_ptr self, replica_config cfg) {
  auto& st = self->state;
  keep_exception_cause(self, "replica " + std::to_string(cfg.index));
  st.cfg = std::move(cfg);
  st.compute = std::make_shared<compute_state>();
  st.tasks = std::make_unique<device_tasks<compute_state>>(
      st.cfg.device, st.compute, [self](const std::string& why) { fail(self, why); });
  st.host = std::make_unique<replica_host_impl>(self);
  if (trace::enabled()) st.track.open("replica:" + std::to_string(st.cfg.index));
  st.host->on_device<std::vector<tensor>>(
      "build_model", [c = st.cfg](compute_state& cs) { return build_model(c, cs); },
      [self](std::vector<tensor>& buffers) { self->state.grad_buffers = std::move(buffers); });
  request_batches(self);
  return {
      [self](train_atom, int64_t step) { return on_train_step(self, step); },
      [self](train_atom, int64_t first, int64_t count) {
        return on_train_steps(self, first, count);
      },
      [self](eval_atom, tensor x, tensor y) { return on_eval(self, std::move(x), std::move(y)); },
      [self](metrics_atom, bool reset) -> metric_sums {
        auto m = self->state.train_metrics;
        if (reset) self->state.train_metrics = {};
        return m;
      },
      [self](state_atom) { return on_state(self); },
      [self](restore_atom, model_state ms) { return on_restore(self, std::move(ms)); },
      [self](computed_atom, uint64_t ticket) {
        self->state.tasks->computed(ticket);
        show_activity(self);
      },
  };
}

replica_actor spawn_replica(caf::actor_system& sys, replica_config cfg) {
  return spawn_visible<replica_actor, replica_state, replica_config>(sys, replica, std::move(cfg));
}

}  // namespace troupe
