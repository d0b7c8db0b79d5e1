#pragma once
// The CAF actor system configuration every troupe process uses (jobs,
// benchmarks, tests), so what is measured is what runs.
#include <caf/all.hpp>

#include "kernels/cpu_isa.hpp"
#include "messages/messages.hpp"

namespace troupe {

// Every thread CAF starts flushes denormals to zero, as the device threads
// do (kernels/cpu_isa.hpp): the variable shards of parameter_server and
// central_storage run their optimizer on the scheduler's threads, where an
// Adam moment decaying through the denormal range costs microcode assists,
// and the same update gives the same bits there as on a device.
class flush_denormals_hook final : public caf::thread_hook {
 public:
  void init(caf::actor_system&) override {}
  void thread_started() override { kernels::flush_denormals_on_this_thread(); }
  void thread_terminates() override {}
};

struct system_config : caf::actor_system_config {
  system_config() {
    register_messages(*this);
    add_thread_hook<flush_denormals_hook>();
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
