#pragma once
// The CUDA backend (built only when TROUPE_HAVE_CUDA): every operation of
// kernels/backend.hpp enqueued on one stream of the current device, with
// pointers in that device's memory. Dense layers are cuBLAS SGEMMs on the
// row-major data (default math mode: no TF32, so results stay close to the
// CPU's), the forward with a bias as one cuBLASLt matmul whose epilogue adds
// the bias and applies ReLU (FP32 compute) where cuBLASLt has an algorithm; convolutions are
// cuDNN's (FMA math, again no TF32; descriptors and algorithms cached per shape, workspace and
// padded copies in buffers the backend grows on demand); the rest are the kernels of
// kernels/cuda_kernels.cu and kernels/cuda_*_layers.cu. Calls return once the work is enqueued; a
// CUDA, cuBLAS or cuDNN error at enqueue time throws std::runtime_error naming the operation ("cuda
// dense_forward: cublasSgemm: ..."), while an error of the work itself surfaces at the next
// synchronizing call (the device context's synchronize or copy_to_host).
#include <memory>

#include <cuda_runtime_api.h>

#include "kernels/backend.hpp"

namespace troupe::kernels {

// Creates a cuBLAS handle on the calling thread's current device, bound to
// `stream` (the cuDNN handle follows at the first convolution); the backend
// owns the handles and its buffers (freed with it), not the stream.
std::unique_ptr<backend> make_cuda_backend(cudaStream_t stream);

}  // namespace troupe::kernels
