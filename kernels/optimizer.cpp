#include "kernels/optimizer.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#include "kernels/elementwise.hpp"
#include "kernels/lr_schedule.hpp"

namespace troupe::kernels {

namespace {

std::vector<std::string> suffixes_for(const std::string& kind) {
  if (kind == "sgd") return {};
  if (kind == "momentum") return {"momentum"};
  if (kind == "adam") return {"adam_m", "adam_v"};
  if (kind == "rmsprop") return {"rms"};
  throw std::invalid_argument("optimizer: unknown kind '" + kind +
                              "' (expected sgd, momentum, adam or rmsprop)");
}

constexpr const char* step_name = "optimizer/step";

}  // namespace

optimizer::optimizer(troupe::optimizer_config cfg, int64_t total_steps)
    : cfg_(std::move(cfg)), total_steps_(total_steps), slot_suffixes_(suffixes_for(cfg_.kind)) {
  // Fails early on an unknown schedule kind.
  (void)learning_rate_at(cfg_, 0, total_steps_);
}

void optimizer::init(const std::vector<troupe::named_tensor>& vars) {
  std::vector<std::string> names;
  std::vector<troupe::shape_t> shapes;
  for (const auto& v : vars) {
    if (v.value.type() != dtype::f32)
      throw std::invalid_argument("optimizer::init: variable '" + v.name + "' is " +
                                  dtype_name(v.value.type()) + ", expected float32");
    names.push_back(v.name);
    shapes.push_back(v.value.shape());
  }
  std::vector<std::vector<troupe::tensor>> slots(slot_suffixes_.size());
  for (auto& per_var : slots)
    for (const auto& s : shapes) per_var.emplace_back(s, dtype::f32);
  names_ = std::move(names);
  shapes_ = std::move(shapes);
  slots_ = std::move(slots);
  step_ = 0;
  initialized_ = true;
}

void optimizer::apply(std::vector<troupe::named_tensor>& vars,
                      const std::vector<troupe::named_tensor>& grads) {
  int64_t total = 0;
  for (const auto& v : vars) total += v.value.numel();
  apply_ranges(vars, grads, {{0, total}});
}

void optimizer::apply_ranges(std::vector<troupe::named_tensor>& vars,
                             const std::vector<troupe::named_tensor>& grads,
                             const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (!initialized_) init(vars);
  if (vars.size() != names_.size())
    throw std::invalid_argument("optimizer::apply: " + std::to_string(vars.size()) +
                                " variables, initialized with " + std::to_string(names_.size()));
  if (grads.size() != vars.size())
    throw std::invalid_argument("optimizer::apply: " + std::to_string(grads.size()) +
                                " gradients for " + std::to_string(vars.size()) + " variables");
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const auto& v = vars[i];
    const auto& g = grads[i];
    if (v.name != names_[i])
      throw std::invalid_argument("optimizer::apply: variable " + std::to_string(i) + " is '" +
                                  v.name + "', initialized as '" + names_[i] + "'");
    if (v.value.type() != dtype::f32 || g.value.type() != dtype::f32)
      throw std::invalid_argument("optimizer::apply: variable '" + v.name +
                                  "' and its gradient must be float32");
    if (v.value.shape() != shapes_[i])
      throw std::invalid_argument("optimizer::apply: variable '" + v.name + "' has shape " +
                                  shape_string(v.value.shape()) + ", initialized as " +
                                  shape_string(shapes_[i]));
    if (g.value.shape() != v.value.shape())
      throw std::invalid_argument("optimizer::apply: gradient '" + g.name + "' for variable '" +
                                  v.name + "' has shape " + shape_string(g.value.shape()) +
                                  ", expected " + shape_string(v.value.shape()));
  }

  std::vector<int64_t> offsets{0};
  for (const auto& v : vars) offsets.push_back(offsets.back() + v.value.numel());
  for (auto [a, b] : ranges)
    if (a < 0 || b < a || b > offsets.back())
      throw std::invalid_argument("optimizer::apply: range [" + std::to_string(a) + ", " +
                                  std::to_string(b) + ") outside the variables' " +
                                  std::to_string(offsets.back()) + " elements");

  const int64_t t = step_ + 1;  // 1-based update count
  std::vector<float*> slot(slots_.size());
  for (auto [a, b] : ranges)
    for (std::size_t i = 0; i < vars.size() && a < b; ++i) {
      int64_t lo = std::max(a, offsets[i]), hi = std::min(b, offsets[i + 1]);
      if (lo >= hi) continue;
      const int64_t off = lo - offsets[i];
      for (std::size_t k = 0; k < slots_.size(); ++k) slot[k] = slots_[k][i].f32() + off;
      update_elements(cpu_backend(), vars[i].value.f32() + off, grads[i].value.f32() + off, slot,
                      static_cast<std::size_t>(hi - lo), t);
    }
  step_ = t;
}

void optimizer::update_elements(backend& ops, float* w, const float* g,
                                const std::vector<float*>& slot, std::size_t n, int64_t t) const {
  const float lr = static_cast<float>(current_lr());
  const float wd = static_cast<float>(cfg_.weight_decay);
  const bool decoupled = cfg_.decoupled_weight_decay && cfg_.weight_decay != 0.0;
  // L2 decay goes into the gradient; decoupled decay is a separate shrink.
  const float l2 = decoupled ? 0.0f : wd;
  if (cfg_.kind == "sgd") {
    if (decoupled) ops.decoupled_decay_step(w, n, lr, wd);
    ops.sgd_step(w, g, n, lr, l2);
  } else if (cfg_.kind == "momentum") {
    if (decoupled) ops.decoupled_decay_step(w, n, lr, wd);
    ops.momentum_step(w, slot[0], g, n, lr, static_cast<float>(cfg_.momentum), cfg_.nesterov, l2);
  } else if (cfg_.kind == "adam") {
    ops.adam_step(w, slot[0], slot[1], g, n, lr, static_cast<float>(cfg_.beta1),
                  static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.epsilon), t, wd,
                  decoupled);
  } else {  // rmsprop
    if (decoupled) ops.decoupled_decay_step(w, n, lr, wd);
    ops.rmsprop_step(w, slot[0], g, n, lr, static_cast<float>(cfg_.rho),
                     static_cast<float>(cfg_.epsilon), l2);
  }
}

void optimizer::apply_on(backend& ops, const std::vector<float*>& w,
                         const std::vector<const float*>& g,
                         const std::vector<std::vector<float*>>& slots) {
  if (!initialized_)
    throw std::logic_error("optimizer::apply_on: call init() with the variables first");
  if (w.size() != names_.size() || g.size() != names_.size() || slots.size() != slots_.size())
    throw std::invalid_argument("optimizer::apply_on: " + std::to_string(w.size()) +
                                " variables, " + std::to_string(g.size()) + " gradients and " +
                                std::to_string(slots.size()) + " slot kinds for " +
                                std::to_string(names_.size()) + " variables and " +
                                std::to_string(slots_.size()) + " slot kinds");
  for (const auto& per_var : slots)
    if (per_var.size() != names_.size())
      throw std::invalid_argument("optimizer::apply_on: a slot kind with " +
                                  std::to_string(per_var.size()) + " variables");
  const int64_t t = step_ + 1;
  std::vector<float*> slot(slots.size());
  for (std::size_t i = 0; i < names_.size(); ++i) {
    for (std::size_t k = 0; k < slots.size(); ++k) slot[k] = slots[k][i];
    update_elements(ops, w[i], g[i], slot,
                    static_cast<std::size_t>(troupe::shape_numel(shapes_[i])), t);
  }
  step_ = t;
}

bool optimizer::capturable(std::string* why) const {
  if (cfg_.kind == "adam") return true;
  if (why) *why = "optimizer \"" + cfg_.kind + "\" has no update that reads its step on the device";
  return false;
}

std::vector<float> optimizer::schedule_table(int64_t first, int64_t count) const {
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(3 * std::max<int64_t>(count, 0)));
  for (int64_t s = first; s < first + count; ++s) {
    const auto lr = static_cast<float>(learning_rate_at(cfg_, s, total_steps_));
    const auto k = ew::adam_scalars_for(lr, static_cast<float>(cfg_.beta1),
                                        static_cast<float>(cfg_.beta2), s + 1);
    out.insert(out.end(), {lr, k.step_size, k.inv_sqrt_bc2});
  }
  return out;
}

void optimizer::apply_scheduled(backend& ops, const std::vector<float*>& w,
                                const std::vector<const float*>& g,
                                const std::vector<std::vector<float*>>& slots, const float* table,
                                const int64_t* counter) const {
  std::string why;
  if (!capturable(&why)) throw std::logic_error("optimizer::apply_scheduled: " + why);
  if (w.size() != names_.size() || g.size() != names_.size() || slots.size() != 2)
    throw std::invalid_argument("optimizer::apply_scheduled: expected " +
                                std::to_string(names_.size()) +
                                " variables with their gradients and Adam's 2 slots");
  const float wd = static_cast<float>(cfg_.weight_decay);
  const bool decoupled = cfg_.decoupled_weight_decay && cfg_.weight_decay != 0.0;
  adam_tensors t;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    t.w.push_back(w[i]);
    t.m.push_back(slots[0][i]);
    t.v.push_back(slots[1][i]);
    t.g.push_back(g[i]);
    t.n.push_back(static_cast<std::size_t>(troupe::shape_numel(shapes_[i])));
  }
  ops.adam_step_scheduled(t, table, counter, static_cast<float>(cfg_.beta1),
                          static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.epsilon), wd,
                          decoupled);
}

double optimizer::lr_at(int64_t step) const {
  return learning_rate_at(cfg_, step, total_steps_);
}

double optimizer::current_lr() const {
  return learning_rate_at(cfg_, step_, total_steps_);
}

int64_t optimizer::step() const {
  return step_;
}

std::vector<troupe::named_tensor> optimizer::state() const {
  std::vector<troupe::named_tensor> out;
  for (std::size_t i = 0; i < names_.size(); ++i)
    for (std::size_t k = 0; k < slot_suffixes_.size(); ++k)
      out.push_back({names_[i] + "/" + slot_suffixes_[k], slots_[k][i].clone()});
  out.push_back({step_name, troupe::tensor::from<int64_t>({1}, {step_})});
  return out;
}

void optimizer::load_state(const std::vector<troupe::named_tensor>& state) {
  if (!initialized_)
    throw std::runtime_error("optimizer::load_state: call init() with the variables first");
  std::map<std::string, const troupe::tensor*> by_name;
  for (const auto& s : state) by_name[s.name] = &s.value;

  auto st = by_name.find(step_name);
  if (st == by_name.end())
    throw std::runtime_error(std::string("optimizer::load_state: missing '") + step_name + "'");
  const troupe::tensor& step_t = *st->second;
  if (step_t.type() != dtype::i64 || step_t.shape() != troupe::shape_t{1})
    throw std::runtime_error(std::string("optimizer::load_state: '") + step_name +
                             "' must be int64 of shape [1], got " + dtype_name(step_t.type()) +
                             " " + shape_string(step_t.shape()));
  const int64_t new_step = step_t.data<int64_t>()[0];
  if (new_step < 0)
    throw std::runtime_error(std::string("optimizer::load_state: '") + step_name +
                             "' is negative (" + std::to_string(new_step) + ")");

  std::vector<std::vector<troupe::tensor>> slots(slot_suffixes_.size());
  for (std::size_t k = 0; k < slot_suffixes_.size(); ++k) {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const std::string name = names_[i] + "/" + slot_suffixes_[k];
      auto it = by_name.find(name);
      if (it == by_name.end())
        throw std::runtime_error("optimizer::load_state: missing slot '" + name + "'");
      const troupe::tensor& t = *it->second;
      if (t.type() != dtype::f32 || t.shape() != shapes_[i])
        throw std::runtime_error("optimizer::load_state: slot '" + name + "' is " +
                                 dtype_name(t.type()) + " " + shape_string(t.shape()) +
                                 ", expected float32 " + shape_string(shapes_[i]));
      slots[k].push_back(t.clone());
    }
  }
  slots_ = std::move(slots);
  step_ = new_step;
}

}  // namespace troupe::kernels
