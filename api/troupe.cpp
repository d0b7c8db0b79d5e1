#include "api/troupe.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <variant>

#include "actors/input_pipeline.hpp"  // replica_slice
#include "actors/reducer.hpp"
#include "actors/system_config.hpp"
#include "devices/device.hpp"

namespace troupe {

namespace {

using collective_result = std::variant<std::vector<tensor>, std::string>;

void collective_waiter(caf::event_based_actor* self, reducer_actor target, reduce_op op,
                       std::vector<tensor> ts,
                       std::shared_ptr<std::promise<collective_result>> out) {
  self->monitor(target);
  self->set_down_handler([self, out](caf::down_msg& dm) {
    out->set_value("its reducer ended (" + to_string(dm.reason) + ")");
    self->quit();
  });
  self->request(target, caf::infinite, allreduce_atom::value, op, std::move(ts))
      .then(
          [self, out](std::vector<tensor>& reduced) {
            out->set_value(std::move(reduced));
            self->quit();
          },
          [self, out](caf::error& e) {
            out->set_value(to_string(e));
            self->quit();
          });
}

}  // namespace

struct replica_group::impl {
  int replicas = 1;
  reducer_config reducers_cfg;
  system_config cfg;
  caf::actor_system sys{cfg};
  device_pool devices;  // "cpu:r" runs replica r
  std::vector<reducer_actor> group;
  bool group_broken = false;

  impl(int n, const std::string& algorithm) : replicas(n) {
    reducers_cfg.algorithm = algorithm;
    for (int r = 0; r < n; ++r) (void)device_of(r);
    group = spawn_reducer_group(sys, n, reducers_cfg);
  }
  std::shared_ptr<cpu_device> device_of(int r) { return devices.get("cpu:" + std::to_string(r)); }
  ~impl() {
    devices.clear();  // joins the device threads before the actor system goes
    for (auto& g : group) caf::anon_send_exit(g, caf::exit_reason::user_shutdown);
  }

  // A failed replica's reducer exits; its peers' reducers see it go and
  // fail the collective they are in, or their next one, with an error reply
  // (actors/reducer.cpp), so nobody waits for ever. The next run() gets a
  // new group.
  void break_group(int failed_rank) {
    caf::anon_send_exit(group[static_cast<std::size_t>(failed_rank)],
                        caf::exit_reason::user_shutdown);
    group_broken = true;
  }

  // The calling (device) thread waits for the reply of its reducer; an
  // actor in between also watches the reducer, so a group broken by a failed
  // replica releases the waiter (a reducer that exits never replies).
  std::vector<tensor> collective(int rank, reduce_op op, std::vector<tensor> ts) {
    auto result = std::make_shared<std::promise<collective_result>>();
    auto done = result->get_future();
    sys.spawn(collective_waiter, group[static_cast<std::size_t>(rank)], op, std::move(ts), result);
    auto r = done.get();
    if (auto* failure = std::get_if<std::string>(&r))
      throw std::runtime_error("all_reduce failed (a peer replica failed or left): " + *failure);
    return std::move(std::get<std::vector<tensor>>(r));
  }
};

replica_group::replica_group(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
replica_group::replica_group(replica_group&&) noexcept = default;
replica_group& replica_group::operator=(replica_group&&) noexcept = default;
replica_group::~replica_group() = default;

replica_group replica_group::one_device() {
  return mirrored(1);
}

replica_group replica_group::mirrored(int replicas, const std::string& algorithm) {
  if (replicas < 0)
    throw std::invalid_argument(
        "replica_group::mirrored: replicas: expected an integer >= 0, got " +
        std::to_string(replicas));
  const int n = replicas == 0 ? static_cast<int>(usable_cpu_cores()) : replicas;
  const auto& known = reducer_algorithms();
  if (std::find(known.begin(), known.end(), algorithm) == known.end())
    throw std::invalid_argument("replica_group::mirrored: unknown all-reduce algorithm '" +
                                algorithm + "'");
  return replica_group(std::make_unique<impl>(n, algorithm));
}

int replica_group::num_replicas() const noexcept {
  return impl_->replicas;
}

double replica_group::reduce(reduce_op op, const std::vector<double>& v) {
  if (v.empty()) throw std::invalid_argument("replica_group::reduce: no values");
  switch (op) {
    case reduce_op::sum:
    case reduce_op::mean: {
      double s = 0;
      for (double x : v) s += x;
      return op == reduce_op::mean ? s / static_cast<double>(v.size()) : s;
    }
    case reduce_op::min:
      return *std::min_element(v.begin(), v.end());
    case reduce_op::max:
      return *std::max_element(v.begin(), v.end());
  }
  return 0;
}

void replica_group::run_erased(const std::function<void(replica_context&)>& fn) {
  auto& im = *impl_;
  if (im.group_broken) {
    for (auto& g : im.group) caf::anon_send_exit(g, caf::exit_reason::user_shutdown);
    im.group = spawn_reducer_group(im.sys, im.replicas, im.reducers_cfg);
    im.group_broken = false;
  }
  std::mutex mu;
  std::condition_variable cv;
  int left = im.replicas;
  std::optional<replica_error> first_error;
  for (int r = 0; r < im.replicas; ++r) {
    im.device_of(r)->submit([&, r] {
      replica_context ctx(*this, r, im.replicas);
      try {
        fn(ctx);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu);
        // The first failure is the cause; the peers' collective errors follow from it.
        if (!first_error) {
          first_error.emplace(r, e.what());
          im.break_group(r);
        }
      }
      std::lock_guard<std::mutex> g(mu);
      if (--left == 0) cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return left == 0; });
  if (first_error) throw *first_error;
}

void replica_context::all_reduce(std::vector<tensor>& tensors, reduce_op op) {
  if (replicas_ == 1) {
    return;  // sum and mean of one replica are its own values
  }
  tensors = owner_->impl_->collective(id_, op, std::move(tensors));
}

void replica_context::all_reduce(std::vector<named_tensor>& tensors, reduce_op op) {
  std::vector<tensor> ts;
  ts.reserve(tensors.size());
  for (auto& t : tensors) ts.push_back(t.value);  // shares the buffers: reduced in place
  all_reduce(ts, op);
}

double replica_context::all_reduce(double value, reduce_op op) {
  std::vector<tensor> ts{tensor::from<float>({1}, {static_cast<float>(value)})};
  all_reduce(ts, op);
  return ts[0].f32()[0];
}

distributed_dataset::distributed_dataset(const data::dataset& d, int64_t global_batch, int replicas,
                                         uint64_t seed, bool shuffle)
    : data_(&d), global_batch_(global_batch), replicas_(replicas), seed_(seed), shuffle_(shuffle) {
  if (global_batch < replicas || replicas < 1)
    throw std::invalid_argument("distributed_dataset: the global batch (" +
                                std::to_string(global_batch) + ") must be >= the replicas (" +
                                std::to_string(replicas) + ") >= 1");
}

int64_t distributed_dataset::steps_per_epoch() const noexcept {
  return (data_->size() + global_batch_ - 1) / global_batch_;
}

std::vector<int64_t> distributed_dataset::slice(int64_t epoch, int64_t step, int replica) const {
  std::lock_guard<std::mutex> g(mu_);
  if (order_epoch_ != epoch) {
    order_ = data::epoch_order(data_->size(), seed_, epoch, shuffle_);
    order_epoch_ = epoch;
  }
  const int64_t begin = step * global_batch_;
  const int64_t n = std::min(global_batch_, data_->size() - begin);
  if (step < 0 || n <= 0)
    throw std::out_of_range("distributed_dataset: step " + std::to_string(step) +
                            " is outside the epoch's " + std::to_string(steps_per_epoch()));
  auto [a, b] = replica_slice(n, replicas_, replica);
  return {order_.begin() + begin + a, order_.begin() + begin + b};
}

int64_t distributed_dataset::rows(int64_t epoch, int64_t step, int replica) const {
  return static_cast<int64_t>(slice(epoch, step, replica).size());
}

void distributed_dataset::batch(int64_t epoch, int64_t step, int replica, tensor& x,
                                tensor& y) const {
  const auto idx = slice(epoch, step, replica);
  data::gather_batch(*data_, idx, x, y);
}

}  // namespace troupe
