#pragma once
// The CAF actor system configuration every troupe process uses (jobs,
// benchmarks, tests), so what is measured is what runs.
#include <caf/all.hpp>

#include "messages/messages.hpp"

namespace troupe {

struct system_config : caf::actor_system_config {
  system_config() {
    register_messages(*this);
    // The sharing policy parks idle threads on a condition variable; the
    // default work-stealing policy polls, which takes CPU from the device
    // threads on small machines (measured: 38% fewer samples/s on 2 cores).
    set("scheduler.policy", caf::atom("sharing"));
    // Scheduler threads only route messages; compute runs on device threads.
    set("scheduler.max-threads", static_cast<size_t>(2));
    set("logger.verbosity", caf::atom("quiet"));
  }
};

}  // namespace troupe
