#include "runtime/preemption.hpp"

#include <csignal>

namespace troupe::preemption {

namespace {

std::atomic<int> requested_signal{0};

}  // namespace

void request(int signal) noexcept {
  int none = 0;
  requested_signal.compare_exchange_strong(none, signal);
}

int requested() noexcept {
  return requested_signal.load();
}

void reset() noexcept {
  requested_signal.store(0);
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    default:
      return "signal " + std::to_string(signal);
  }
}

watch::watch(std::function<void(int)> on_request, int poll_ms)
    : on_request_(std::move(on_request)), poll_ms_(poll_ms), thread_([this] { run(); }) {}

watch::~watch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void watch::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (int sig = requested()) {
      lock.unlock();
      on_request_(sig);
      return;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(poll_ms_));
  }
}

}  // namespace troupe::preemption
