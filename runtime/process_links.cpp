#include "runtime/process_links.hpp"

#include <future>
#include <thread>

namespace troupe {
namespace {

using clock_type = std::chrono::steady_clock;

// The offer rank `from` (the right neighbour) made to `node`, once it has.
ring_link_offer await_offer(caf::actor_system& sys, const ring_node_actor& node, int32_t from,
                            const std::string& task, clock_type::time_point deadline) {
  caf::scoped_actor self{sys};
  for (;;) {
    bool found = false;
    ring_link_offer offer;
    self->request(node, std::chrono::seconds(5), ring_offer_atom::value, from)
        .receive(
            [&](std::string& host, uint16_t port, std::string& key) {
              offer = {std::move(host), port, std::move(key)};
              found = true;
            },
            [](caf::error&) {});
    if (found) return offer;
    if (clock_type::now() >= deadline)
      throw device_error("process ring: " + task + " made no direct-link offer in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::shared_ptr<process_ring> join_process_links(caf::actor_system& sys,
                                                 const ring_node_actor& node, int32_t rank,
                                                 const std::vector<std::string>& tasks,
                                                 const process_link_options& how,
                                                 clock_type::time_point deadline) {
  const auto P = static_cast<int32_t>(tasks.size());
  const int32_t right = (rank + 1) % P;
  const int32_t left = (rank + P - 1) % P;
  const std::string& right_task = tasks[static_cast<std::size_t>(right)];
  const std::string& left_task = tasks[static_cast<std::size_t>(left)];
  ring_link_listener listener(how.bind_host, how.same_host);
  const auto& mine = listener.offer();
  caf::anon_send(node, ring_offer_atom::value, mine.host, mine.port, mine.key);
  // Accepting runs beside connecting: with two processes each waits for the
  // other's challenge at once.
  auto accepted = std::async(std::launch::async,
                             [&] { return listener.accept(deadline, left_task, how.encrypted); });
  ring_socket to_next = connect_ring_link(await_offer(sys, node, right, right_task, deadline),
                                          deadline, right_task, how.encrypted, how.same_host);
  auto ring = std::make_shared<process_ring>(rank, P, std::move(to_next), accepted.get(),
                                             std::chrono::seconds(60), how.wire);
  ring->set_yield_for(how.yield_for);
  return ring;
}

}  // namespace troupe
