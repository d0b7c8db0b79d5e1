#pragma once
// `troupe node`: one process of a job whose config has a cluster spec
// (config/cluster.hpp). Every process reads the same config and builds the
// actors its task hosts (runtime/topology.hpp); the chief runs the
// coordinator, which drives remote replicas and shards exactly as local ones.
//
// Joining (every connection is opened by one side only: a pair of processes
// connecting to each other at once makes CAF drop one of the connections):
//   - each task publishes its node actor (messages/node_messages.hpp) at its
//     address, bound to the host the spec names;
//   - ps tasks spawn their shards; worker tasks connect to every ps task;
//     every task then connects to the chief; each connection starts with the
//     mutual challenge/response of config/secret.hpp, and a peer that fails
//     it is refused, logged, and can call nothing but the handshake;
//   - once all tasks have joined (or cluster.join_timeout_seconds passed: an
//     error naming who is missing), the chief orders every task with replicas
//     to build them, with the shard handles and, for mirrored across
//     processes, the ring of tasks: each worker connects to the workers before
//     it in the ring, and its replicas reduce through the hierarchical
//     reducer (in the process, then a ring across processes, then back);
//   - the chief runs the job; when it ends it tells every task to stop.
// Failure: every task monitors the chief; the chief's coordinator monitors
// every remote replica, shard and task (BASP heartbeats every
// cluster.heartbeat_seconds detect a hung process). mirrored and
// central_storage end naming the lost task; parameter_server and
// elastic_average go on without a lost worker task.
#include <nlohmann/json.hpp>

#include "config/cluster.hpp"
#include "config/job_config.hpp"
#include "runtime/job.hpp"

namespace troupe {

// Runs `task` of the job's cluster until the job ends. The chief returns the
// job's summary (as run_job); other tasks return an empty object once the
// chief ends the job successfully. Throws job_error naming the task or peer
// on failure (a peer lost, the join timeout, a refused handshake),
// config_error for a config without a cluster or a task it lacks, and
// secret_error for a missing secret.
// The actor system is ended within 5 s of the job's end (see
// node_system_left_running).
nlohmann::json run_node(const job_config& c, const task_id& task, const job_options& o = {});

// True once run_node's actor system did not stop within its limit (CAF 0.17
// can keep a stopped actor alive at shutdown; see node.cpp): its threads are
// still waiting, so the process should flush its output and end with
// std::_Exit rather than run its static destructors under them.
bool node_system_left_running();

}  // namespace troupe
