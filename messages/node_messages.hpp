#pragma once
// The protocol between the processes of one job (`troupe node`, one per task
// of the cluster spec; runtime/node.hpp). Each task publishes one node actor
// at its address, and it is the only actor a peer can reach before it has
// proved it knows the cluster's secret.
#include <cstdint>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "messages/messages.hpp"
#include "messages/protocols.hpp"
#include "messages/remote_ring_messages.hpp"

namespace troupe {

using challenge_atom = caf::atom_constant<caf::atom("challenge")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using build_atom = caf::atom_constant<caf::atom("build")>;
using built_atom = caf::atom_constant<caf::atom("built")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using ring_node_atom = caf::atom_constant<caf::atom("ringnode")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using joined_atom = caf::atom_constant<caf::atom("joined")>;
using running_atom = caf::atom_constant<caf::atom("running")>;

// What a task hosts: its shards (once it joined) and its replicas (once it
// built them), with the global index of each.
struct node_parts {
  std::string task;
  std::vector<int64_t> shard_indices;
  std::vector<variable_shard_actor> shards;
  std::vector<int64_t> replica_indices;
  std::vector<replica_actor> replicas;
  std::vector<std::string> devices;  // devices[k] runs replicas[k]
  // A strategy with a job of its own: its actors placed like replicas, by
  // replica_indices (strategy::own_job; actor_learner: rl_actors).
  std::vector<caf::actor> others;
};

// The chief's order to a task with replicas: build them.
struct node_build {
  int64_t start_step = 0;                    // where the job (re)starts
  std::vector<variable_shard_actor> shards;  // every shard, by index
  // mirrored across processes: the tasks with replicas, in ring order (this
  // task's rank is its position); empty = no ring.
  std::vector<std::string> ring_tasks;
  // A strategy with a job of its own: the chief's actors that the task's
  // actors are wired to (actor_learner: the trajectory queue, the
  // coordinator).
  caf::message hub;
  // mirrored with the "device" all-reduce on cuda across processes, not hierarchical:
  // the ncclUniqueId (128 raw bytes) of the job's one NCCL group, made by the
  // chief; empty = none. A string, not a byte vector: CAF checks a string's
  // length against the bytes received before allocating, but resizes a byte
  // vector to whatever length the message claims (the fuzzer's OOM).
  std::string device_group_id;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_parts& x) {
  return f(caf::meta::type_name("node_parts"), x.task, x.shard_indices, x.shards, x.replica_indices,
           x.replicas, x.devices, x.others);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_build& x) {
  return f(caf::meta::type_name("node_build"), x.start_step, x.shards, x.ring_tasks, x.hub,
           x.device_group_id);
}

// A task's node actor. Only `challenge` and `hello` answer a peer that has
// not completed the handshake (config/secret.hpp), and each other message
// only the role the comments below name (runtime/node_actor.cpp); an
// anonymous one never: everything else is refused, with an error to a
// request, and logged.
using node_actor = caf::typed_actor<
    // (caller's task) -> a fresh challenge for it.
    caf::replies_to<challenge_atom, std::string>::with<std::string>,
    // (caller's task, its response to our challenge, a challenge for us) ->
    // our response to its challenge. The caller is trusted from then on.
    caf::replies_to<hello_atom, std::string, std::string, std::string>::with<std::string>,
    // task -> chief, once the task has checked the chief's response: it has
    // joined, with its own node actor and what it hosts.
    caf::reacts_to<joined_atom, caf::actor, node_parts>,
    // chief -> task: spawn your replicas; replies with what was built.
    caf::replies_to<build_atom, node_build>::with<node_parts>,
    // peer -> task: this task's ring node (mirrored across processes).
    caf::replies_to<ring_node_atom>::with<ring_node_actor>,
    // Inside the process: the main thread finished a build, or it failed
    // (why).
    caf::reacts_to<built_atom, node_parts>, caf::reacts_to<built_atom, std::string>,
    // Inside the process: this peer's node actor (task name) passed the
    // handshake, trust it; with the flag, also monitor it (its loss ends
    // this task).
    caf::reacts_to<watch_atom, caf::actor, std::string, bool>,
    // chief -> task: the job is over (reason "" = success; preempted: the
    // signal that stopped it with a checkpoint to resume from, "" = none);
    // the task exits. On the chief, from its own main thread: tell every
    // task that joined. Replies with the number of tasks told.
    caf::replies_to<stop_atom, std::string, std::string>::with<int32_t>,
    // Inside a task's process: it was asked to leave (signal); its node actor
    // tells the chief's, which stops the job with a checkpoint ("SIGTERM to
    // worker:1"), so one evicted pod does not cost the steps since the last
    // checkpoint.
    caf::reacts_to<preempt_atom, std::string>,
    // On the chief, from its main thread: the job runs with this coordinator
    // (a coordinator_actor); a worker task that joins from now on (a
    // restarted process) gets `order` and its replicas or actors rejoin
    // (parameter_server, elastic_average, actor_learner).
    caf::reacts_to<running_atom, caf::actor, node_build>>;

// Registers the node protocol's types (called by register_messages()).
void register_node_messages(caf::actor_system_config& cfg);

}  // namespace troupe
