// The connecting side of the gate (net/gate.hpp): the exchange, TLS on
// the socket after it, and BASP over the plain end for an actor handle.
#include <sys/socket.h>
#include <unistd.h>
#include <caf/io/basp_broker.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "config/secret.hpp"
#include "net/basp_guard.hpp"
#include "net/gate.hpp"
#include "net/secure_link.hpp"
#include "net/socket.hpp"

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;
using net::recv_exact;
using net::send_all;

}  // namespace

gate_socket gate_handshake(const std::string& host, uint16_t port, const gate_options& opts,
                           caf::timespan timeout) {
  gate_socket out;
  const auto where = host + ":" + std::to_string(port);
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(timeout);
  const int fd = net::connect_tcp(host, port, deadline, out.error);
  if (fd < 0) {
    out.unreachable = true;
    return out;
  }
  // `retry`: a failure that may pass (the listener busy or restarting).
  auto fail = [&](const std::string& why, bool retry = false) {
    ::close(fd);
    out.error = why;
    out.unreachable = retry;
    return out;
  };
  std::string why;
  std::string hello(gate_wire::kHelloBytes, '\0');
  if (!recv_exact(fd, hello, deadline, &why)) return fail(where + " " + why, true);
  auto server_challenge = gate_wire::check_hello(hello);
  // Whatever is on the port may not be the task (a squatter, a process of
  // another job, the task restarting): only a verdict MAC'd with the
  // cluster's key is final; all else is worth retrying.
  if (server_challenge.empty())
    return fail(where + " is not a troupe node (no gate handshake)", true);
  const auto key = derive_key(opts.secret, key_purpose::gate);
  auto client_challenge = make_challenge();
  if (!send_all(fd,
                gate_wire::make_proof(key, opts.name, opts.expect_peer, server_challenge,
                                      client_challenge),
                deadline))
    return fail(where + " closed the connection during the handshake", true);
  if (opts.certificate_proof) {
    // Certificates: this task's certificate and its signature
    // over the exchange, before the verdict.
    std::string proof;
    try {
      proof = gate_certificate::make_proof(
          opts.link, gate_wire::certificate_transcript(server_challenge, client_challenge,
                                                       opts.name, opts.expect_peer));
    } catch (const link_error& e) {
      return fail(e.what());
    }
    if (!send_all(fd, proof, deadline))
      return fail(where + " closed the connection during the handshake", true);
  }
  std::string verdict(gate_wire::kVerdictBytes, '\0');
  if (!recv_exact(fd, verdict, deadline, &why)) return fail(where + " " + why, true);
  auto check = gate_wire::check_verdict(key, server_challenge, client_challenge, verdict);
  // Another task of the cluster on that port (e.g. the chief's rendezvous
  // before its node listens there) is not the one dialed: retried too.
  if (check.authentic && !opts.expect_peer.empty() && check.name != opts.expect_peer)
    return fail(where + " is " + check.name + ", not " + opts.expect_peer, true);
  if (!check.problem.empty()) return fail(where + " " + check.problem, !check.authentic);
  out.fd = fd;
  out.peer = check.name;
  out.server_challenge = server_challenge;
  out.client_challenge = client_challenge;
  out.error.clear();
  return out;
}

namespace {

// TLS on an authenticated socket, waiting for its handshake until
// `deadline`: the plain end, or fd -1 with the reason. `opts` is keyed
// (with_link_key) already.
gate_socket secure(gate_socket authenticated, const std::string& where, const gate_options& opts,
                   std::vector<char> local_node, clock_type::time_point deadline) {
  link_params lp;
  lp.listener = false;
  lp.me = opts.name;
  lp.peer_task = authenticated.peer;
  lp.peer_address = where;
  lp.server_challenge = authenticated.server_challenge;
  lp.client_challenge = authenticated.client_challenge;
  lp.local_node = std::move(local_node);
  link_end end;
  try {
    end = open_link(authenticated.fd, opts.link, std::move(lp));
  } catch (const link_error& e) {
    authenticated.fd = -1;  // open_link closed it
    authenticated.error = where + ": " + e.what();
    return authenticated;
  }
  std::string problem = "no TLS handshake in time";
  if (end.ready.wait_until(deadline) == std::future_status::ready) problem = end.ready.get();
  if (!problem.empty()) {
    ::close(end.plain_fd);
    authenticated.fd = -1;
    // Worth retrying until the caller's deadline, which then names it: a
    // listener too busy to finish TLS in time (a flood on its port, a
    // loaded machine) or that evicted this handshake for newer ones may
    // finish the next one, and with certificates and no secret the gate
    // proves nothing, so anyone on the port gets this far and can fail it.
    authenticated.unreachable = true;
    authenticated.error = authenticated.peer + " at " + where + ": " + problem;
    return authenticated;
  }
  authenticated.fd = end.plain_fd;
  return authenticated;
}

}  // namespace

gate_socket gate_secure_handshake(const std::string& host, uint16_t port, const gate_options& opts,
                                  caf::timespan timeout) {
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(timeout);
  const auto keyed = with_link_key(opts);  // one key derivation for both steps
  auto authenticated = gate_handshake(host, port, keyed, timeout);
  if (authenticated.fd < 0) return authenticated;
  return secure(std::move(authenticated), host + ":" + std::to_string(port), keyed, {}, deadline);
}

gate_connection gate_connect(caf::actor_system& sys, const std::string& host, uint16_t port,
                             const gate_options& opts, const std::set<std::string>& ifs,
                             caf::timespan timeout) {
  gate_connection out;
  const auto where = host + ":" + std::to_string(port);
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(timeout);
  const auto keyed = with_link_key(opts);  // one key derivation for both steps
  auto authenticated = gate_handshake(host, port, keyed, timeout);
  if (authenticated.fd < 0) {
    out.unreachable = authenticated.unreachable;
    out.error = std::move(authenticated.error);
    return out;
  }
  const auto peer = authenticated.peer;
  // Both sides proved the secret: TLS on the socket, then BASP on the plain
  // end of the link.
  authenticated =
      secure(std::move(authenticated), where, keyed, serialized_node_id(sys.node()), deadline);
  if (authenticated.fd < 0) {
    out.unreachable = authenticated.unreachable;
    out.error = std::move(authenticated.error);
    return out;
  }
  auto scribe = sys.middleman().backend().new_scribe(authenticated.fd);
  auto basp = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  auto left = std::max(caf::timespan{std::chrono::milliseconds(100)},
                       std::chrono::duration_cast<caf::timespan>(deadline - clock_type::now()));
  caf::scoped_actor self{sys};
  self->request(basp, left, caf::connect_atom::value, std::move(scribe), port)
      .receive(
          [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& theirs) {
            if (!ptr)
              out.error = peer + " at " + where + " serves no actor";
            else if (!sys.assignable(theirs, ifs))
              out.error = peer + " at " + where + " serves an actor of another interface";
            else
              out.actor = std::move(ptr);
          },
          [&](caf::error& e) { out.error = where + ": BASP handshake: " + sys.render(e); });
  if (out.actor) out.error.clear();
  return out;
}

}  // namespace troupe
