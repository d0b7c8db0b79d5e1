#pragma once
// Control messages inside a process carry their sender.
//
// Why: a BASP message whose source actor is 0 reaches its receiver without
// a sender, exactly like CAF's anon_send from a thread of this process. A
// handler that took "no sender" for "this process" (the node actor's
// preempt, watch, built and running; the coordinator's preempt and rejoin)
// obeyed any holder of the secret who addressed it by its actor id, with no
// node handshake (issue 40: the whole job preempted by a stranger). So this
// process's threads send control messages from a short-lived actor of their
// own, and the receivers take them only from a sender on their own node.
// The gate's guard now drops every message without a sender from another
// process (net/basp_guard.hpp), so troupe sends across processes only
// from an actor; anon_send and anon_send_exit are for actors of this
// process.
#include <caf/all.hpp>
#include <utility>

namespace troupe {

// Sends `xs` to `to` from an actor of this process (from any thread).
template <class Handle, class... Ts>
void send_from_here(caf::actor_system& sys, const Handle& to, Ts&&... xs) {
  caf::scoped_actor self{sys};
  self->send(to, std::forward<Ts>(xs)...);
}

// Whether the message `self` handles now came from this process (an
// anonymous one never does).
template <class Self>
bool sent_from_here(Self* self) {
  const auto& s = self->current_sender();
  return s && s->node() == self->home_system().node();
}

// The current sender, for a log line: its node, or that it has none.
template <class Self>
std::string sender_text(Self* self) {
  const auto& s = self->current_sender();
  if (!s) return "an anonymous sender (no source actor)";
  return "node " + to_string(s->node());
}

}  // namespace troupe
