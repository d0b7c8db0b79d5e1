#pragma once
// What the process ring's files share (runtime/process_ring.cpp: the
// collectives over the links; runtime/ring_links.cpp: setting the links up;
// runtime/ring_shm.cpp: the shared-memory links of one host). Not for use
// outside them.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::ring_detail {

using clock_type = std::chrono::steady_clock;

// "<call>: <errno's text>".
inline std::string errno_text(const char* call) {
  return std::string(call) + ": " + std::strerror(errno);
}

// Milliseconds until `t`, for poll(): 0 once past, at most a minute.
inline int ms_until(clock_type::time_point t) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - clock_type::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// A link that broke during a collective: the ring fails with it, naming
// the link.
class link_broken : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace troupe::ring_detail
