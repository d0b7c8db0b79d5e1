#pragma once
// ThreadSanitizer and CAF 0.17: CAF hands a message from the sending thread
// to the thread that runs the receiver through its lock-free mailbox, and an
// actor from one scheduler thread to the next through the same mailbox
// states. That synchronisation is real, but it lives in libcaf_core, which is
// not instrumented, so ThreadSanitizer does not see it and reports the
// message's payload, and the actor's own state, as raced on.
//
// visible_mailbox<Base> states exactly that synchronisation, no more, in
// ThreadSanitizer's terms: enqueue() releases on the mailbox element, which
// consume() acquires before CAF looks at the message (one sync object per
// message: a receiver does not also synchronise with what senders did after
// sending), and every consume() acquires and releases the actor itself
// (handlers run one at a time, possibly on different threads), as does the
// clean-up of an actor that nobody references any more. Without
// -fsanitize=thread all of it compiles to nothing.
#include <caf/all.hpp>

#if defined(__SANITIZE_THREAD__)
#define TROUPE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TROUPE_TSAN 1
#endif
#endif

#ifdef TROUPE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace troupe {

inline void tsan_release(void* p) {
#ifdef TROUPE_TSAN
  __tsan_release(p);
#else
  (void)p;
#endif
}

inline void tsan_acquire(void* p) {
#ifdef TROUPE_TSAN
  __tsan_acquire(p);
#else
  (void)p;
#endif
}

template <class Base>
class visible_mailbox : public Base {
 public:
  using Base::Base;
  using Base::enqueue;

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* host) override {
    tsan_release(what.get());
    Base::enqueue(std::move(what), host);
  }

  caf::invoke_message_result consume(caf::mailbox_element& x) override {
    tsan_acquire(&x);
    tsan_acquire(this);
    auto result = Base::consume(x);
    tsan_release(this);
    return result;
  }

  // An actor that nobody references any more is cleaned up (its state
  // destroyed) by whichever thread drops the last reference.
  void on_destroy() override {
    tsan_acquire(this);
    Base::on_destroy();
  }

  void initialize() override {
    tsan_acquire(this);
    Base::initialize();
    tsan_release(this);
  }
};

// A stateful typed actor whose behavior is `fn(self, config)`, with its
// mailbox hand-over visible (spawned by spawn_visible below).
template <class Handle, class State, class Config>
class visible_stateful_actor final
    : public visible_mailbox<typename Handle::template stateful_base<State>> {
 public:
  using behavior_type = typename Handle::behavior_type;
  using fn_type = behavior_type (*)(typename Handle::template stateful_pointer<State>, Config);
  visible_stateful_actor(caf::actor_config& cfg, fn_type fn, Config c)
      : visible_mailbox<typename Handle::template stateful_base<State>>(cfg),
        fn_(fn),
        c_(std::move(c)) {}
  behavior_type make_behavior() override { return fn_(this, std::move(c_)); }

 private:
  fn_type fn_;
  Config c_;
};

template <class Handle, class State, class Config>
Handle spawn_visible(caf::actor_system& sys,
                     typename visible_stateful_actor<Handle, State, Config>::fn_type fn, Config c) {
  return sys.spawn<visible_stateful_actor<Handle, State, Config>>(fn, std::move(c));
}

}  // namespace troupe
