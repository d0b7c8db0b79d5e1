#pragma once
// What a process's replicas (or a strategy's own workers) are, before and
// after they are spawned: shared by the topology builder (runtime/topology.hpp)
// and the strategies that spawn workers of their own (strategy::spawn_own_workers).
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/partitioner.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "collectives/process_group.hpp"
#include "devices/device.hpp"
#include "messages/protocols.hpp"

namespace troupe {

// What a process's replicas are: their indices and devices, the shards and
// placement (shard strategies), the resume position, and, across processes,
// the ring the strategy's reducers may use.
struct worker_spec {
  std::vector<int64_t> indices;              // global replica indices
  std::vector<std::string> devices;          // devices[k] runs indices[k]
  std::vector<variable_shard_actor> shards;  // every shard, by index (shard strategies)
  placement place;
  int64_t start_step = 0;
  caf::duration request_timeout = caf::infinite;  // see replica_config
  ring_node_actor ring;                           // this process's ring node, or null
  std::vector<std::string> ring_tasks;            // the ring of processes, or empty
  int64_t ring_rank = 0;                          // this process's place in ring_tasks
  std::string device_group_id;                    // see node_build
  // The process's direct links to the other processes (runtime/
  // process_ring.hpp, strategy::uses_process_links), or null.
  std::shared_ptr<process_group> process_links;
};

// The actors of a process's replicas: devices, input pipelines, replicas,
// and the reducers their strategy gave them.
struct worker_parts {
  device_pool devices;
  std::vector<int64_t> indices;  // global replica indices, in the order below
  std::vector<input_pipeline_actor> pipelines;
  std::vector<replica_actor> replicas;
  std::vector<reducer_actor> reducers;  // one per replica, or empty
  // A strategy with a job of its own (strategy::own_job): its actors placed
  // like replicas (actor_learner: rl_actors), by index as `indices`.
  std::vector<caf::actor> others;
  // Every actor by name, for the coordinator to monitor.
  std::vector<std::pair<std::string, caf::actor>> named() const;
  // Sends every actor an exit (user_shutdown).
  void stop() const;
};

}  // namespace troupe
