// One libFuzzer target per parser (tests/fuzz/CMakeLists.txt builds this file
// once per TROUPE_FUZZ_TARGET, a function of targets.hpp). A clean refusal
// returns; a crash, sanitizer report or escaping exception is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#ifdef TROUPE_FUZZ_HEADER
#include TROUPE_FUZZ_HEADER
#else
#include "tests/fuzz/targets.hpp"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  (void)troupe::fuzz::TROUPE_FUZZ_TARGET(
      std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
