// Wiring ring nodes across processes: publishing, connecting, the
// rendezvous of the ranks, and wiring a node as its rank.
#include <thread>

#include "actors/reducers/remote_ring.hpp"

namespace troupe {

namespace {

caf::error ring_error(std::string text) {
  return caf::make_error(caf::sec::runtime_error, std::move(text));
}

}  // namespace

caf::expected<uint16_t> publish_ring_node(caf::actor_system& sys, const ring_node_actor& node,
                                          uint16_t port, const std::string& bind) {
  return sys.middleman().publish(node, port, bind.empty() ? nullptr : bind.c_str(), true);
}

caf::expected<ring_peer_actor> connect_ring_peer(caf::actor_system& sys, const std::string& host,
                                                 uint16_t port, caf::timespan timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto h = sys.middleman().remote_actor<ring_node_actor>(host, port);
    if (h) return ring_peer_actor{*h};
    if (h.error() != caf::sec::cannot_connect_to_node ||
        std::chrono::steady_clock::now() >= deadline)
      return ring_error("remote_ring: cannot reach ring node at " + host + ":" +
                        std::to_string(port) + ": " + sys.render(h.error()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

caf::error wire_ring_node(caf::actor_system& sys, const ring_node_actor& node, int32_t rank,
                          std::vector<ring_peer_actor> peers, caf::timespan timeout) {
  caf::scoped_actor self{sys};
  caf::error result;
  self->request(node, timeout, ring_wire_atom::value, rank, std::move(peers))
      .receive([](int32_t) {}, [&](caf::error& e) { result = std::move(e); });
  return result;
}

namespace {

// Waits until rank `p` introduced itself to `node` (its ring_hello).
caf::expected<ring_peer_actor> await_introduction(caf::scoped_actor& self,
                                                  const ring_node_actor& node, int32_t p,
                                                  std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    caf::expected<ring_peer_actor> peer{caf::sec::request_timeout};
    self->request(node, std::chrono::seconds(5), ring_known_atom::value, p)
        .receive([&](ring_peer_actor& h) { peer = std::move(h); }, [](caf::error&) {});
    if (peer || std::chrono::steady_clock::now() >= deadline) return peer;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

caf::error rendezvous_ring(caf::actor_system& sys, const ring_node_actor& node, int32_t rank,
                           int32_t size, const ring_peer_finder& find_lower,
                           const std::function<std::string(int32_t)>& rank_name,
                           std::chrono::steady_clock::time_point deadline,
                           caf::timespan wire_timeout) {
  std::vector<ring_peer_actor> peers(static_cast<std::size_t>(size));
  peers[static_cast<std::size_t>(rank)] = node;
  // The hellos go from an actor: a lower rank's ring node lives in another
  // process, whose guard drops a message without a sender
  // (net/basp_guard.hpp).
  caf::scoped_actor self{sys};
  for (int32_t p = 0; p < rank; ++p) {
    auto h = find_lower(p);
    if (!h) return std::move(h.error());
    peers[static_cast<std::size_t>(p)] = std::move(*h);
    self->send(caf::actor_cast<ring_node_actor>(peers[static_cast<std::size_t>(p)]),
               ring_hello_atom::value, rank, ring_peer_actor{node});
  }
  for (int32_t p = rank + 1; p < size; ++p) {
    auto h = await_introduction(self, node, p, deadline);
    if (!h) return ring_error("remote_ring: " + rank_name(p) + " did not join the ring in time");
    peers[static_cast<std::size_t>(p)] = std::move(*h);
  }
  return wire_ring_node(sys, node, rank, std::move(peers), wire_timeout);
}

caf::error join_ring(caf::actor_system& sys, const ring_node_actor& node, int32_t rank,
                     const std::vector<std::pair<std::string, uint16_t>>& addresses,
                     caf::timespan timeout, const ring_connector& connect) {
  auto where = [&](int32_t p) {
    const auto& [host, port] = addresses[static_cast<std::size_t>(p)];
    return "rank " + std::to_string(p) + " at " + host + ":" + std::to_string(port);
  };
  auto find_lower = [&](int32_t p) {
    const auto& [host, port] = addresses[static_cast<std::size_t>(p)];
    return connect ? connect(host, port, timeout) : connect_ring_peer(sys, host, port, timeout);
  };
  return rendezvous_ring(sys, node, rank, static_cast<int32_t>(addresses.size()), find_lower, where,
                         std::chrono::steady_clock::now() + timeout, timeout);
}

}  // namespace troupe
