#pragma once
// Design note "device tasks" (docs/design.md, section 8).
// Work on a device thread, its continuation back on the actor. An actor that
// owns device state (a model, an optimizer, environments) never touches it
// itself: it submits tasks to its cpu_device, which runs them in order on its
// thread and answers `computed_atom, ticket`; the actor's computed handler
// then runs the task's continuation. So the device state is touched by one
// thread, the actor's state by the actor, and no thread ever blocks.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <caf/all.hpp>

#include "devices/device.hpp"
#include "messages/messages.hpp"
#include "trace/trace.hpp"

namespace troupe {

template <class State>
class device_tasks {
 public:
  using fail_fn = std::function<void(const std::string&)>;

  // `on_error` runs on the actor, instead of the continuation, with the
  // message of an exception a task threw.
  device_tasks(std::shared_ptr<cpu_device> dev, std::shared_ptr<State> state, fail_fn on_error)
      : dev_(std::move(dev)), state_(std::move(state)), on_error_(std::move(on_error)) {}

  // `work` runs on the device thread, then `then` on the actor `self` (whose
  // protocol reacts to computed_atom and calls computed()).
  template <class Self>
  void submit(Self* self, std::function<void(State&)> work, std::function<void()> then) {
    submit(self, "device_task", std::move(work), std::move(then));
  }
  // The same; `span` names the work on the device's track of a timeline
  // trace (a string literal), `args` what it belongs to (e.g. the step).
  template <class Self>
  void submit(Self* self, const char* span, std::function<void(State&)> work,
              std::function<void()> then, trace::span_args args = {}) {
    auto ticket = next_++;
    auto error = std::make_shared<std::string>();
    pending_.emplace(ticket, entry{std::move(then), error, span});
    // A strong handle: the actor outlives the tasks it submitted.
    auto handle = caf::actor_cast<caf::actor>(self);
    dev_->submit([st = state_, error, work = std::move(work), handle, ticket, span, args] {
      try {
        trace::scoped_span on_device(trace::this_thread_track(), span, trace::category::compute,
                                     args);
        work(*st);
      } catch (const std::exception& e) {
        *error = e.what();
        if (error->empty()) *error = "device task failed (an exception without a message)";
      } catch (...) {
        *error = "device task failed (an exception not derived from std::exception)";
      }
      caf::anon_send(handle, computed_atom::value, ticket);
    });
  }

  // From the actor's computed handler.
  void computed(uint64_t ticket) {
    auto it = pending_.find(ticket);
    if (it == pending_.end()) return;
    auto e = std::move(it->second);
    pending_.erase(it);
    if (!e.error->empty())
      on_error_(*e.error);
    else if (e.then)
      e.then();
  }

  bool idle() const { return pending_.empty(); }
  // The span of the oldest task not answered yet (what the actor waits for
  // on the device), or null when none is.
  const char* oldest_span() const {
    return pending_.empty() ? nullptr : pending_.begin()->second.span;
  }
  const std::shared_ptr<cpu_device>& device() const { return dev_; }

 private:
  struct entry {
    std::function<void()> then;
    std::shared_ptr<std::string> error;
    const char* span;
  };
  std::shared_ptr<cpu_device> dev_;
  std::shared_ptr<State> state_;
  fail_fn on_error_;
  uint64_t next_ = 0;
  std::map<uint64_t, entry> pending_;
};

}  // namespace troupe
