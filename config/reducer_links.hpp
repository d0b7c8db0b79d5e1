#pragma once
// How the processes of a mirrored job on device collectives exchange
// (strategy.reducer.transport, .wire, .same_host): parsed once, here as
// enums, by config/strategy_keys.cpp; read by the runtime's direct links
// (runtime/process_ring.hpp).

namespace troupe {

// How the processes' first replicas exchange on device collectives across
// processes: `direct` = over sockets of their own, on the device thread
// (runtime/process_ring.hpp); `actors` = through the CAF ring nodes.
enum class reducer_transport { direct, actors };

// The number format of gradients on the direct links (sums stay fp32).
enum class wire_format { fp32, bf16 };

// A direct link to a process of this host (and network namespace):
// `shared_memory` = a ring in a memfd handed over the admitted Unix socket
// (config "shm"); `unix_socket` = the Unix socket itself, plain bytes that
// never leave the kernel ("unix"); `tcp` = as between hosts (TLS 1.3 unless
// cluster.insecure).
enum class same_host_link { tcp, unix_socket, shared_memory };

// The config spellings: "direct"/"actors", "fp32"/"bf16", "tcp"/"unix"/"shm".
const char* name_of(reducer_transport t);
const char* name_of(wire_format w);
const char* name_of(same_host_link l);

}  // namespace troupe
