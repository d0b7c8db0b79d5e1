#pragma once
// The cuda:N device context (devices/cuda_context.cpp, built with the CUDA
// path): one compute stream and one copy stream on the device, cuBLAS and the
// kernels of kernels/cuda_kernels.cu as its backend, a caching allocator over
// cudaMalloc, and pinned host staging buffers (a caching allocator over
// cudaHostAlloc) for every transfer.
#include <memory>

#include "devices/device_context.hpp"

namespace troupe {

#ifdef TROUPE_HAVE_CUDA
// Binds the calling thread to the device (cudaSetDevice) and creates its
// streams and cuBLAS handle; throws device_error naming the device and the
// CUDA error.
std::shared_ptr<device_context> make_cuda_context(const device_spec& d);
// Makes the device's CUDA context (the process's primary context), which
// takes long enough (100-300 ms) to be worth doing while the data loads;
// any thread. Throws device_error.
void prepare_cuda_device(const device_spec& d);
// The context's compute stream (a cudaStream_t) for work issued outside its
// backend (NCCL collectives); throws device_error when ctx is not a cuda:N
// context.
void* cuda_compute_stream(device_context& ctx);
#else
inline void prepare_cuda_device(const device_spec&) {}
inline std::shared_ptr<device_context> make_cuda_context(const device_spec& d) {
  throw device_error(d.str() + " requested, but this troupe build has no CUDA support");
}
#endif

}  // namespace troupe
