#pragma once
// The actor system configuration of a troupe process that networks (troupe
// node, the cross-process ring, its tests and benchmarks): system_config.hpp's,
// plus CAF's middleman.
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstddef>

#include "actors/system_config.hpp"

namespace troupe {

// troupe's system_config plus the middleman (CAF 0.17:
// load<caf::io::middleman>() before the actor_system is built), BASP
// heartbeats, so that a hung peer process is detected within about
// `connection_timeout`, and `middleman_workers` BASP worker threads (0: the
// middleman's own thread deserializes incoming messages; CAF's default of 1
// worker costs one more copy of every received byte and a thread hand-off:
// bench_remote_allreduce measured 0 as cheaper in CPU and faster).
struct net_system_config : system_config {
  // Defined in actors/net_system.cpp, which also holds what LeakSanitizer
  // is told about CAF 0.17's BASP broker.
  explicit net_system_config(caf::timespan heartbeat = std::chrono::milliseconds(200),
                             caf::timespan connection_timeout = std::chrono::seconds(2),
                             std::size_t middleman_workers = 0);
};

}  // namespace troupe
