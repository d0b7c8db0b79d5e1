#include "kernels/cpu_isa.hpp"

#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace troupe::kernels {

const char* isa_name(cpu_isa isa) {
  switch (isa) {
    case cpu_isa::baseline:
      return "baseline";
    case cpu_isa::avx2:
      return "avx2";
    case cpu_isa::avx512:
      break;
  }
  return "avx512";
}

std::optional<cpu_isa> parse_isa(std::string_view s) {
  if (s == "baseline") return cpu_isa::baseline;
  if (s == "avx2") return cpu_isa::avx2;
  if (s == "avx512") return cpu_isa::avx512;
  return std::nullopt;
}

cpu_isa detected_isa() {
  // __builtin_cpu_supports reads CPUID and checks that the OS saves the
  // registers (XGETBV), so a level reported here is safe to run.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return cpu_isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return cpu_isa::avx2;
  return cpu_isa::baseline;
}

bool cpu_supports(cpu_isa isa) {
  return static_cast<int>(isa) <= static_cast<int>(detected_isa());
}

std::optional<cpu_isa> requested_isa() {
  const char* env = std::getenv("TROUPE_CPU_ISA");
  if (!env || !*env) return std::nullopt;
  auto isa = parse_isa(env);
  if (!isa)
    throw std::invalid_argument(std::string("TROUPE_CPU_ISA: expected \"baseline\", \"avx2\" or "
                                            "\"avx512\", got \"") +
                                env + "\"");
  if (!cpu_supports(*isa))
    throw std::invalid_argument(std::string("TROUPE_CPU_ISA: this CPU does not support ") + env +
                                " (its widest level is " + isa_name(detected_isa()) + ")");
  return isa;
}

cpu_isa active_isa() {
  static const cpu_isa chosen = [] { return requested_isa().value_or(detected_isa()); }();
  return chosen;
}

namespace {
// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6).
constexpr unsigned kFlushToZero = 0x8000;
constexpr unsigned kDenormalsAreZero = 0x0040;
}  // namespace

void flush_denormals_on_this_thread() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(_mm_getcsr() | kFlushToZero | kDenormalsAreZero);
#endif
}

bool flushes_denormals_on_this_thread() {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned both = kFlushToZero | kDenormalsAreZero;
  return (_mm_getcsr() & both) == both;
#else
  return false;
#endif
}

}  // namespace troupe::kernels
