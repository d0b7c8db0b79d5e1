#include "actors/net_system_config.hpp"

namespace troupe {

net_system_config::net_system_config(caf::timespan heartbeat, caf::timespan connection_timeout,
                                     std::size_t middleman_workers) {
  load<caf::io::middleman>();
  set("middleman.heartbeat-interval", heartbeat);
  set("middleman.connection-timeout", connection_timeout);
  set("middleman.workers", middleman_workers);
}

}  // namespace troupe

#if defined(__SANITIZE_ADDRESS__)
// CAF 0.17's BASP broker can end up in a reference cycle at shutdown (its
// spawn-server helpers and proxies keep it alive while it holds them; CAF
// does not drain a stopped broker's mailbox), so that it and everything it
// holds outlive the actor system. That happens only when a process's
// connections are still up as it stops, which is timing, not troupe's code:
// the broker's allocation is the root of the cycle, and LeakSanitizer, told
// to ignore it, ignores what is reachable from it and nothing else. Every
// binary that networks builds a net_system_config, so this object file is
// linked wherever it is needed.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:caf::io::basp_broker\n"
         "leak:caf::io::basp::instance::handle\n";
}
#endif
