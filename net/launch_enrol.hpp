#pragma once
// Enrolment of a `troupe launch` task with the launcher's job CA
// (net/job_ca.hpp) over a socket the launcher handed it.
//
// Why: the rendezvous (net/rendezvous.hpp) issues each rank its
// certificate at the chief; the tasks of `troupe launch` meet no
// rendezvous, but all are the launcher's children. So the launcher makes the
// job CA in memory and, for every start of a task (restarts included),
// creates a socket pair and passes one end to that child only (its number in
// TROUPE_ENROL_FD; the other children never see it). The child makes its own
// key pair, sends one signed request naming its task, and gets back a
// certificate for it with the CA's certificate. The launcher knows which
// child it started as which task: a request naming another task is refused,
// and the socket is closed after one answer, so each start gets one
// certificate. Its links then check certificates as the rendezvous' do.
//
// Frames (SOCK_SEQPACKET: each is one message, read whole):
//   task -> launcher   request: magic "troupeL1", task name NUL-padded to
//                      kTaskBytes, Ed25519 public key (32 bytes), then its
//                      signature over all of that (64 bytes)
//   launcher -> task   the rendezvous' reply frame (rendezvous_wire::
//                      make_reply): {"certificate": PEM, "ca": PEM} or
//                      {"error": "why"}
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "net/job_ca.hpp"

namespace troupe::launch_enrol {

// The variable naming the inherited socket.
inline constexpr const char* kFdVariable = "TROUPE_ENROL_FD";
inline constexpr std::size_t kMagicBytes = 8;
inline constexpr char kMagic[kMagicBytes + 1] = "troupeL1";
inline constexpr std::size_t kTaskBytes = 64;
inline constexpr std::size_t kRequestBytes = kMagicBytes + kTaskBytes + task_key::kPublicBytes;
inline constexpr std::size_t kFrameBytes = kRequestBytes + task_key::kSignatureBytes;

// The signed part of a request, and the whole request signed with `key`.
std::string make_request(const std::string& task, const std::string& public_key);
std::string make_frame(const std::string& task, const task_key& key);

// The launcher's answer to `frame` from the child it started as `task`: a
// reply frame with the certificate, or with the error (also in `refusal`).
std::string answer(const job_authority& ca, const std::string& task, std::string_view frame,
                   std::string& refusal);

// The identity a reply payload (rendezvous_wire::make_reply) issues `task`
// for `key`, checked (its task, its key, the CA's signature); `problem` ""
// once it is usable, else why not (the issuer's refusal, quoted).
task_identity identity_of_reply(std::string_view payload, const std::string& task,
                                const task_key& key, std::string& problem);

// The fd in TROUPE_ENROL_FD's value `text`, checked to be an open socket;
// throws job_ca_error naming the variable and the value.
int fd_of_variable(const char* text);

// The child's side: a key made here, the request over `fd`, the certificate
// back, checked (its task, its key, the CA's signature). Closes `fd`. Throws
// job_ca_error naming the variable and what went wrong.
task_identity enrol(int fd, const std::string& task, std::chrono::seconds timeout);

}  // namespace troupe::launch_enrol
