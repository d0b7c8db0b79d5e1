#pragma once
// What kernels/onednn.cpp shares with the other oneDNN users inside
// troupe_kernels (the layer primitives of kernels/cpu_conv_pool.cpp): the one
// engine and the calling thread's stream. Not installed, not for callers
// outside this library (they do not see oneDNN's headers).
#include <dnnl.hpp>

namespace troupe::kernels::onednn::detail {

// The process's engine, its ISA capped at active_isa() before any kernel is
// generated.
const dnnl::engine& engine();
// The calling thread's stream; the first call on a thread also holds that
// thread's OpenMP team to one.
dnnl::stream& thread_stream();

}  // namespace troupe::kernels::onednn::detail
