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
// What makes a device's first use slow, done while the data loads (any
// thread): the process's primary context (100-300 ms), a device context with
// its streams and library handles, and a first product through cuBLAS and
// cuBLASLt (and a first convolution through cuDNN when `convolutions`), which
// loads the libraries and their first kernels. The next make_cuda_context of
// the device takes that context. Throws device_error.
void prepare_cuda_device(const device_spec& d, bool convolutions);
void release_prepared_cuda_devices();
// Whether a prepared context of device `index` waits to be taken.
bool cuda_device_prepared(int index);
// The context's compute stream (a cudaStream_t) for work issued outside its
// backend (NCCL collectives); throws device_error when ctx is not a cuda:N
// context.
void* cuda_compute_stream(device_context& ctx);
#else
inline void prepare_cuda_device(const device_spec&, bool) {}
inline void release_prepared_cuda_devices() {}
inline bool cuda_device_prepared(int) {
  return false;
}
inline std::shared_ptr<device_context> make_cuda_context(const device_spec& d) {
  throw device_error(d.str() + " requested, but this troupe build has no CUDA support");
}
#endif

}  // namespace troupe
