#pragma once
// Enrolment of tasks started by hand with the chief's job CA: per-task
// identity for a written-out cluster.tasks (`troupe node --task`, no
// launcher, no rendezvous) under cluster.identity "job_ca".
//
// Why: such tasks meet no rendezvous (net/rendezvous.hpp) and no launcher
// (net/launch_enrol.hpp), so their links used to be keyed from the shared
// secret, and any holder of it could prove any task's name. Now the chief
// makes the job CA in memory when it starts and holds it for the whole job
// (a restarted task needs a certificate too); it issues itself a
// certificate and opens a side door on its gate (net/gate.hpp,
// gate_options::side_door, named "chief:0/enrol"). Every other task, before
// its own gate opens, makes its own key pair, passes the chief's gate to
// that door with the secret (TLS keyed from it, as the rendezvous), sends
// troupe launch's certificate request (launch_enrol::make_frame: its task,
// its public key, signed with the private half) and gets the rendezvous'
// reply frame back: a certificate naming the task it proved at the gate,
// with the CA's certificate. Its links then check certificates as with
// cluster.tls: the secret alone speaks as no task.
//
// Once per live holder: a task name is held while the connection it enrolled
// on is open, or while it has a live link to the chief (net/basp_guard.hpp):
// the task keeps its enrolment connection open until its link to the chief
// is up, then closes it. While held, a second claim of the name is refused
// (at the gate, or by the desk when it is only enrolled), logged at warning
// naming the task, and the claimant is told why; once the task's process has
// gone (both closed), a restart is issued a new certificate for its new key.
// The chief's own name is never issued. What is not prevented: the first
// claimant of a name nobody holds wins (a holder of the secret may enrol as
// a task before the real one starts; the real one then cannot enrol, and its
// join deadline names the refusal).
//
// Frames (after the gate's exchange and TLS, so only between holders of the
// secret; each of a size known before reading):
//   task -> chief   launch_enrol::make_frame (kFrameBytes)
//   chief -> task   rendezvous_wire::make_reply: {"certificate": PEM, "ca":
//                   PEM} or {"error": "why"}; then nothing until the task
//                   closes.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "net/job_ca.hpp"

namespace troupe::chief_enrol {

// The side door's name at the chief `chief` (e.g. "chief:0/enrol").
std::string door_of(const std::string& chief);

// What the desk has done; counters only grow.
struct desk_stats {
  uint64_t issued = 0;
  uint64_t refused = 0;  // a held name, a bad request, or no request in time
};

// The chief's side: the job CA and the enrolments, on a thread of its own.
class desk {
 public:
  // `chief`: this task's name (never issued to another). `is_live`: whether
  // a task has a live link to this process (called on the desk's thread).
  desk(std::string chief, std::function<bool(const std::string&)> is_live);
  ~desk();  // closes every connection it holds
  desk(const desk&) = delete;
  desk& operator=(const desk&) = delete;

  // The chief's own identity from the job CA.
  task_identity issue_self() const;
  // From the gate's thread: a connection of `name` (proved at the gate)
  // through the side door; the desk owns `fd`.
  void add(int fd, const std::string& name, const std::string& peer);
  desk_stats stats() const;

 private:
  struct state;
  std::unique_ptr<state> st_;
  std::thread thread_;
};

// A task's enrolment: its identity, and the connection that holds its name
// at the chief until the caller closes it (once its link to the chief is up).
struct enrolment {
  task_identity identity;
  int held_fd = -1;
};

// The task's side: a key made here, the request to `chief` at host:port
// through its side door, retried (the chief not there yet, or the name still
// held by a predecessor that is closing) until `deadline`; throws
// job_ca_error naming the chief, its address and the last refusal.
enrolment enrol(const std::string& secret, const std::string& task, const std::string& chief,
                const std::string& host, uint16_t port,
                std::chrono::steady_clock::time_point deadline);

}  // namespace troupe::chief_enrol
