// The chief of troupe node: waits for every task, orders the builds, runs
// the coordinator over every process's replicas and shards.
#include <spdlog/spdlog.h>

#include <cctype>

#include "actors/failure.hpp"
#include "runtime/coordinator.hpp"
#include "runtime/node_process.hpp"
#include "runtime/stall_watch.hpp"
#include "runtime/stop_policy.hpp"
#include "strategies/strategy.hpp"

namespace troupe::node_detail {

namespace {

// The chief: waits for every task to join.
void wait_for_tasks(node_process& np, std::map<std::string, node_event>& joined,
                    clock_type::time_point deadline) {
  std::vector<std::string> expected;
  for (const auto& p : np.placement)
    if (p.task.job != "chief") expected.push_back(p.task.str());
  while (joined.size() < expected.size()) {
    auto ev = np.shared->events.pop_until(deadline);
    if (!ev) {
      std::string missing, present;
      for (const auto& t : expected) {
        auto& list = joined.count(t) ? present : missing;
        list += (list.empty() ? "" : ", ") + t;
      }
      throw job_error("join timeout: after " + fmt::format("{:g}", np.spec().join_timeout_seconds) +
                      " s still waiting for " + missing +
                      (present.empty() ? "" : " (joined: " + present + ")"));
    }
    if (ev->kind == node_event::joined) {
      auto t = ev->task;
      joined[t] = std::move(*ev);
    } else if (ev->kind == node_event::lost) {
      throw job_error("task " + ev->task + " was lost while the job was starting (" + ev->reason +
                      ")");
    }
  }
  spdlog::info("chief: all {} tasks joined", expected.size() + 1);
}

// A failed job names the processes lost around its failure first: when a
// process dies, a peer's collective often fails (and reaches the
// coordinator) a moment before the chief's own connection to it drops, and
// "ring stage failed" alone hides the cause.
// "worker:1" in `text`, not as the start of "worker:10".
bool names_task(const std::string& text, const std::string& task) {
  for (auto at = text.find(task); at != std::string::npos; at = text.find(task, at + 1)) {
    const auto end = at + task.size();
    if (end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

std::string with_lost_tasks(node_process& np, const std::string& failure) {
  const auto until = clock_type::now() + std::chrono::milliseconds(300);
  while (auto ev = np.shared->events.pop_until(until))
    if (ev->kind == node_event::lost)
      return names_task(failure, ev->task)
                 ? failure
                 : "lost " + ev->task + " (" + ev->reason + "); then " + failure;
  return failure;
}

// The chief's order to every task with replicas or workers: where the job
// starts, every shard, the ring of processes and the device group, or a
// strategy's hub (job_hub::handles()).
node_build build_order(node_process& np, const shard_set& shards, const job_hub* hub) {
  const auto& c = np.c;
  const auto& strat = *np.plan->strat;
  node_build order;
  order.start_step = np.plan->start_step;
  if (hub) {
    order.hub = hub->handles();
    return order;
  }
  // Every shard by index, from this process and the tasks that host them.
  order.shards.assign(static_cast<std::size_t>(strat.has_variable_shards() ? c.strategy.shards : 0),
                      {});
  for (std::size_t k = 0; k < np.mine.shards.size(); ++k)
    order.shards[static_cast<std::size_t>(np.mine.shards[k])] = shards.actors[k];
  for (auto& [t, ev] : np.joined)
    for (std::size_t k = 0; k < ev.parts.shard_indices.size() && k < ev.parts.shards.size(); ++k)
      order.shards.at(static_cast<std::size_t>(ev.parts.shard_indices[k])) = ev.parts.shards[k];
  for (std::size_t s = 0; s < order.shards.size(); ++s)
    if (!order.shards[s]) throw job_error("no task brought variable_shard " + std::to_string(s));
  for (const auto& p : np.placement)
    if (!p.replicas.empty()) order.ring_tasks.push_back(p.task.str());
  if (!strat.reduces_across_processes() || order.ring_tasks.size() < 2) order.ring_tasks.clear();
  order.device_group_id = strat.device_group_id(c, order.ring_tasks.size());
  return order;
}

// The tasks the job runs on: the chief's own, if it hosts replicas, and
// every task that joined.
std::vector<std::string> job_tasks(const node_process& np) {
  std::vector<std::string> out;
  if (!np.mine.replicas.empty()) out.push_back(np.name());
  for (const auto& [task, ev] : np.joined) out.push_back(task);
  return out;
}

}  // namespace

nlohmann::json run_chief(node_process& np, shard_set& shards, worker_parts& workers,
                         clock_type::time_point deadline, std::shared_ptr<job_hub>& hub) {
  const auto& c = np.c;
  auto& sys = np.sys;
  const auto& strat = *np.plan->strat;
  wait_for_tasks(np, np.joined, deadline);
  auto plan = std::make_shared<job_plan>(*np.plan);
  plan->request_timeout = kRequestTimeout;
  auto parts = std::make_shared<job_parts>();
  auto coord = sys.spawn(coordinator, std::shared_ptr<const job_plan>(plan), parts);
  if (strat.own_job()) hub = strat.spawn_hub(sys, plan, coord);
  auto order = build_order(np, shards, hub.get());

  // Builds run everywhere at once (the ring joins need every member).
  caf::scoped_actor self{sys};
  const auto build_timeout = np.join_timeout + std::chrono::seconds(60);
  std::vector<std::string> building;
  using build_reply =
      decltype(self->request(node_actor{}, build_timeout, build_atom::value, order));
  std::vector<build_reply> replies;
  for (const auto& p : np.placement)
    if (!p.replicas.empty() && p.task.job != "chief") {
      replies.push_back(self->request(caf::actor_cast<node_actor>(np.joined.at(p.task.str()).node),
                                      build_timeout, build_atom::value, order));
      building.push_back(p.task.str());
    }
  const auto n = static_cast<std::size_t>(strat.replica_count(c));
  if (!hub) {
    parts->replicas.resize(n);
    plan->replica_tasks.assign(n, "");
  }
  auto take = [&](const node_parts& built, const std::string& t) {
    for (std::size_t k = 0; k < built.replica_indices.size(); ++k) {
      if (hub) {
        if (k < built.others.size())
          parts->workers.emplace_back(built.replica_indices[k], built.others[k]);
        continue;
      }
      auto r = static_cast<std::size_t>(built.replica_indices[k]);
      parts->replicas.at(r) = built.replicas.at(k);
      plan->replica_tasks[r] = t;
    }
  };
  if (!np.mine.replicas.empty()) {
    workers = np.build_workers(order);
    take(np.parts_of(workers), "chief");
  }
  std::string failure;
  for (std::size_t k = 0; k < replies.size(); ++k)
    replies[k].receive([&](node_parts& built) { take(built, building[k]); },
                       [&](caf::error& e) {
                         if (failure.empty()) failure = building[k] + ": " + describe(e);
                       });
  if (!failure.empty())
    throw job_error(std::string("building the ") + (hub ? "actors" : "replicas") +
                    " failed: " + failure);
  for (std::size_t r = 0; r < parts->replicas.size(); ++r)
    if (!parts->replicas[r]) throw job_error("no task brought replica " + std::to_string(r));
  spdlog::info("chief: {} {}s on {} tasks, {} shards; starting", n, strat.replica_unit(),
               building.size() + (np.mine.replicas.empty() ? 0 : 1), order.shards.size());

  // The coordinator watches every actor here and every remote task: losing
  // one ends the job, except a worker task under a strategy that goes on
  // without it (its replicas are dropped instead).
  parts->others = workers.named();
  // (Spawned with an argument: CAF 0.17 dereferences a null argument tuple
  // for a functor without one.)
  auto gate_watch =
      sys.spawn([](caf::event_based_actor*, int) -> caf::behavior { return {[](int) {}}; }, 0);
  {
    std::lock_guard<std::mutex> guard(np.shared->gate_watch_mutex);
    np.shared->gate_watch = gate_watch;
  }
  parts->others.emplace_back("its gate", gate_watch);
  for (auto& [t, ev] : np.joined) {
    bool worker_only = ev.parts.shard_indices.empty();
    if (strat.survives_lost_workers() && worker_only) continue;
    parts->others.emplace_back("task " + t, ev.node);
  }
  parts->shards = plan_shards(*plan);
  parts->shards.actors = order.shards;
  parts->hub = hub;
  self->send(np.node, running_atom::value, caf::actor_cast<caf::actor>(coord), order);
  nlohmann::json summary;
  try {
    // A job that stops making progress while every peer looks alive says
    // so, naming the tasks it runs on.
    stall_watch stalls(
        np.name(), fmt::format("{}", fmt::join(job_tasks(np), ", ")), kStallWarning,
        [] { return stop_policy::published_step(); },
        [] { return stop_policy::current() == stop_policy::phase::training; });
    summary = run_coordinator(sys, coord);
  } catch (const job_error& e) {
    failure = e.what();
  }
  self->send_exit(gate_watch, caf::exit_reason::user_shutdown);
  self->send_exit(coord, caf::exit_reason::user_shutdown);
  if (!failure.empty()) throw job_error(with_lost_tasks(np, failure));
  return summary;
}

}  // namespace troupe::node_detail
