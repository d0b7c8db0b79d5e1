// A process of troupe node: connecting to peers (with the handshake), the
// ring across processes, building this task's replicas or workers.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "actors/failure.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "config/secret.hpp"
#include "runtime/node_process.hpp"
#include "runtime/process_links.hpp"

namespace troupe::node_detail {

node_actor node_process::connect(const task_id& task, const node_parts& parts,
                                 clock_type::time_point deadline) {
  auto it = connected.find(task.str());
  if (it != connected.end()) return it->second;
  const auto& address = task_address(spec(), task);
  auto hp = parse_host_port(address);
  node_actor peer;
  std::string last, refusal;
  for (;;) {
    bool retry = false;
    auto opts = gate_opts();
    opts.expect_peer = task.str();  // a proof for `task` only, a verdict from it only
    auto h = gate_remote_actor<node_actor>(sys, hp.host, hp.port, opts, std::chrono::seconds(10),
                                           &retry);
    if (h) {
      peer = std::move(*h);
      break;
    }
    last = describe(h.error());
    // Only a refusal MAC'd by `task` itself is final; anything else on the
    // port (a squatter, a restarting task, a wrong secret that makes the
    // refusal unverifiable) is retried until the deadline, which then names
    // the refusal seen.
    if (!retry) throw job_error(name() + ": joining " + task.str() + " failed: " + last);
    if (gate_wire::names_refusal(last)) refusal = last;
    if (clock_type::now() >= deadline)
      throw job_error(name() + ": cannot reach " + task.str() + " at " + address + " within " +
                      fmt::format("{:g}", spec().join_timeout_seconds) + " s (" + last +
                      (refusal.empty() || refusal == last ? "" : "; before that: " + refusal) +
                      ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (auto failure = node_handshake(sys, node, peer, name(), task.str(), shared->handshake_key,
                                    task.job == "chief");
      !failure.empty())
    throw job_error(name() + ": " + failure);
  connected[task.str()] = peer;
  // Sent after the handshake told this process's node actor to trust the
  // chief, so that it does before the chief can act on the join.
  if (task.job == "chief") caf::scoped_actor {
      sys
      } -> send(peer, joined_atom::value, caf::actor_cast<caf::actor>(node), parts);
  spdlog::info("{}: connected to {} at {}", name(), task.str(), address);
  return peer;
}

std::string node_handshake(caf::actor_system& sys, const node_actor& node, const node_actor& peer,
                           const std::string& me, const std::string& peer_task,
                           const std::string& key, bool monitor) {
  caf::scoped_actor self{sys};
  std::string challenge;
  std::string failure;
  self->request(peer, std::chrono::seconds(10), challenge_atom::value, me)
      .receive([&](std::string& ch) { challenge = std::move(ch); },
               [&](caf::error& e) { failure = describe(e); });
  if (!failure.empty()) return "handshake with " + peer_task + " failed: " + failure;
  auto mine_challenge = make_challenge();
  auto response = challenge_response(key, challenge, me);
  self->request(peer, std::chrono::seconds(10), hello_atom::value, me, response, mine_challenge)
      .receive(
          [&](std::string& theirs) {
            if (!verify_challenge_response(key, mine_challenge, peer_task, theirs))
              failure = peer_task + " did not prove it knows the cluster secret";
          },
          [&](caf::error& e) { failure = describe(e); });
  if (!failure.empty()) return "joining " + peer_task + " failed: " + failure;
  // Its requests to this process are welcome now.
  self->send(node, watch_atom::value, caf::actor_cast<caf::actor>(peer), peer_task, monitor);
  return {};
}

void node_process::join_process_ring(const std::vector<std::string>& ring_tasks) {
  auto rank_it = std::find(ring_tasks.begin(), ring_tasks.end(), name());
  if (rank_it == ring_tasks.end()) throw job_error(name() + ": not in the ring it was given");
  const auto rank = static_cast<int32_t>(rank_it - ring_tasks.begin());
  const auto deadline = clock_type::now() + join_timeout;
  auto task_of = [&](int32_t p) { return ring_tasks[static_cast<std::size_t>(p)]; };
  auto ring_node_of = [&](int32_t p) -> caf::expected<ring_peer_actor> {
    auto peer = connect(parse_task_name(task_of(p)), {}, deadline);
    caf::scoped_actor self{sys};
    caf::expected<ring_peer_actor> found{caf::sec::request_timeout};
    self->request(peer, std::chrono::seconds(10), ring_node_atom::value)
        .receive([&](ring_node_actor& r) { found = ring_peer_actor{r}; },
                 [&](caf::error& e) {
                   found = caf::make_error(caf::sec::runtime_error,
                                           "ring with " + task_of(p) + ": " + describe(e));
                 });
    return found;
  };
  if (auto err = rendezvous_ring(sys, ring, rank, static_cast<int32_t>(ring_tasks.size()),
                                 ring_node_of, task_of, deadline))
    throw job_error(name() + ": joining the ring failed: " + describe(err));
  spdlog::info("{}: ring rank {} of {}", name(), rank, ring_tasks.size());
}

std::shared_ptr<process_group> node_process::join_links(
    const std::vector<std::string>& ring_tasks) {
  const auto rank = static_cast<int32_t>(std::find(ring_tasks.begin(), ring_tasks.end(), name()) -
                                         ring_tasks.begin());
  process_link_options how;
  how.bind_host = parse_host_port(task_address(spec(), me)).host;
  how.encrypted = !spec().insecure;
  how.same_host = c.strategy.reducer.same_host;
  how.wire = c.strategy.reducer.wire == wire_format::bf16 ? ring_wire::bf16 : ring_wire::fp32;
  how.yield_for = std::chrono::microseconds(c.strategy.reducer.yield_us);
  auto links =
      join_process_links(sys, ring, rank, ring_tasks, how, clock_type::now() + join_timeout);
  spdlog::info(
      "{}: direct links to {} ({}) and from {} ({}), {} on the wire, a wait yields {} us "
      "before it sleeps",
      name(), ring_tasks[static_cast<std::size_t>((rank + 1) % ring_tasks.size())],
      links->next_link(),
      ring_tasks[static_cast<std::size_t>((rank + ring_tasks.size() - 1) % ring_tasks.size())],
      links->prev_link(), name_of(c.strategy.reducer.wire), c.strategy.reducer.yield_us);
  return links;
}

worker_parts node_process::build_workers(const node_build& order) {
  worker_spec ws;
  ws.indices = mine.replicas;
  ws.devices = mine.devices;
  ws.shards = order.shards;
  ws.place = plan_shards(*plan).place;
  ws.start_step = order.start_step;
  ws.request_timeout = kRequestTimeout;
  if (order.ring_tasks.size() > 1) {
    join_process_ring(order.ring_tasks);
    ws.ring = ring;
    ws.ring_tasks = order.ring_tasks;
    ws.ring_rank = std::find(order.ring_tasks.begin(), order.ring_tasks.end(), name()) -
                   order.ring_tasks.begin();
    if (plan->strat->uses_process_links(c)) ws.process_links = join_links(order.ring_tasks);
  }
  ws.device_group_id = order.device_group_id;
  return spawn_job_workers(sys, plan, std::move(ws), order.hub);
}

node_parts node_process::parts_of(const worker_parts& w) const {
  node_parts p;
  p.task = name();
  p.replica_indices = w.indices;
  p.replicas = w.replicas;
  p.others = w.others;
  p.devices = mine.devices;
  return p;
}

}  // namespace troupe::node_detail
