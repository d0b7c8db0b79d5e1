#include "actors/worker_parts.hpp"

namespace troupe {

std::vector<std::pair<std::string, caf::actor>> worker_parts::named() const {
  std::vector<std::pair<std::string, caf::actor>> out;
  for (std::size_t i = 0; i < pipelines.size(); ++i)
    out.emplace_back("input_pipeline " + std::to_string(indices[i]),
                     caf::actor_cast<caf::actor>(pipelines[i]));
  for (std::size_t i = 0; i < reducers.size(); ++i)
    out.emplace_back("reducer " + std::to_string(indices[i]),
                     caf::actor_cast<caf::actor>(reducers[i]));
  return out;
}

// A task's parts are its own process's actors: the exits may go without a
// sender (another process's guard would drop them).
void worker_parts::stop() const {
  for (auto& r : replicas) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  for (auto& p : pipelines) caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  for (auto& q : reducers) caf::anon_send_exit(q, caf::exit_reason::user_shutdown);
  for (auto& o : others) caf::anon_send_exit(o, caf::exit_reason::user_shutdown);
}

}  // namespace troupe
