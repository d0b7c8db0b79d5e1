#include "actors/strategy_api.hpp"

namespace troupe {

void collect_replica_states(coordinator_host& h, std::function<void(std::vector<model_state>&)> k) {
  auto& replicas = h.replicas();
  fan_in<model_state> states(replicas.size(), std::move(k),
                             h.failed("reading replica state failed"));
  for (std::size_t i = 0; i < replicas.size(); ++i)
    h.self()
        ->request(replicas[i], h.request_timeout(), state_atom::value)
        .then(states.reply(i), states.error());
}

}  // namespace troupe
