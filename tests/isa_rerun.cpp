// isa_rerun LEVEL TEST [ARGS...]: runs TEST with TROUPE_CPU_ISA=LEVEL, or
// exits 77 (ctest: skipped) when LEVEL is this CPU's own widest level, whose
// run the default one is already (kernels/cpu_isa.hpp).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu_isa.hpp"

int main(int argc, char** argv) {
  using namespace troupe::kernels;
  auto level = argc >= 3 ? parse_isa(argv[1]) : std::nullopt;
  if (!level) {
    std::fprintf(stderr, "usage: isa_rerun baseline|avx2|avx512 TEST [ARGS...]\n");
    return 2;
  }
  if (*level == detected_isa()) {
    std::printf(
        "SKIPPED: %s is this CPU's widest level: the run without TROUPE_CPU_ISA is this one\n",
        argv[1]);
    return 77;
  }
  ::setenv("TROUPE_CPU_ISA", argv[1], 1);
  ::execv(argv[2], argv + 2);
  std::perror(argv[2]);
  return 127;
}
