#pragma once
// A task's end of a gate, for tests that play a task of a secret-keyed
// cluster against a live chief (test_job_ca, test_nodes): the handshake
// with the secret, as a named task, to a peer that must be chief:0.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "net/gate.hpp"
#include "net/job_ca.hpp"

namespace troupe::test {

// The gate handshake and TLS to the chief at 127.0.0.1:port as task `as`
// of the job keyed by `secret`. `id` null: the link is keyed from the
// secret alone; else it presents that certificate (the task's own, or a
// forged one). The socket, or fd < 0 and the connector's error.
inline gate_socket handshake_with_chief(uint16_t port, const std::string& secret,
                                        const std::string& as, const task_identity* id = nullptr,
                                        caf::timespan timeout = std::chrono::seconds(5)) {
  gate_options o;
  o.secret = secret;
  o.name = as;
  o.expect_peer = "chief:0";
  if (id) {
    o.link.kind = link_security::trust::certificates;
    o.link.identity = std::make_shared<const task_identity>(*id);
  }
  return gate_secure_handshake("127.0.0.1", port, o, timeout);
}

}  // namespace troupe::test
