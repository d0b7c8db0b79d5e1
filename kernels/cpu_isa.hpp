#pragma once
// Which vector instruction set the CPU kernels run: chosen once per process
// from the CPU's features (CPUID), never from its model number, so a CPU that
// no table knows yet still gets the widest kernels it supports. Both halves
// of the CPU compute follow it: troupe's own loops (kernels/vector_kernels.hpp,
// compiled once per level) and oneDNN's matrix products (capped with
// dnnl::set_max_cpu_isa). The shipped binary stays portable to any x86-64.
//
// TROUPE_CPU_ISA=avx2 (or baseline) forces a lower level, for comparisons and
// tests; a level the CPU lacks is refused by name.
#include <optional>
#include <string>
#include <string_view>

namespace troupe::kernels {

enum class cpu_isa : int {
  baseline = 0,  // x86-64 (SSE2): every CPU
  avx2 = 1,      // AVX2 + FMA (Haswell, Zen 1 and later)
  avx512 = 2,    // AVX-512 F, BW, DQ, VL (Skylake-SP, Zen 4 and later)
};

const char* isa_name(cpu_isa isa);
// "baseline" / "avx2" / "avx512"; nullopt otherwise.
std::optional<cpu_isa> parse_isa(std::string_view s);

// The widest level this CPU (and its OS: XSAVE state enabled) supports.
cpu_isa detected_isa();
// Whether this CPU can run `isa` (every level up to detected_isa()).
bool cpu_supports(cpu_isa isa);

// The level in use: TROUPE_CPU_ISA when set (an unknown value or a level
// above detected_isa() throws std::invalid_argument naming it), else
// detected_isa(). Decided on the first call; thread-safe.
cpu_isa active_isa();

// What the environment asks for, checked: nullopt when TROUPE_CPU_ISA is
// unset; throws std::invalid_argument for a bad value.
std::optional<cpu_isa> requested_isa();

// Sets this thread's SSE/AVX control (MXCSR) to flush denormal results to
// zero and read denormal inputs as zero, as TensorFlow's CPU threads do. A
// denormal costs a microcode assist (~100 cycles) on most x86 cores, and
// training makes them: a weight whose gradient stays 0 (a border pixel's, a
// dead unit's) decays Adam's first moment by 0.9 a step, through the
// denormal range, for ~150 steps. Measured on a Xeon (model 207): Adam on
// the MLP's 269k parameters from 0.13 to 0.5 ms a step after 1000 steps on
// one batch. Device threads call it once, at their start.
void flush_denormals_on_this_thread();
// Whether this thread flushes and reads denormals as zero (both bits set).
bool flushes_denormals_on_this_thread();

}  // namespace troupe::kernels
