// Turning CUDA runtime errors into stsa exceptions. Every runtime call and every
// launch in src/cuda goes through STSA_CUDA_CHECK, so a failure names the call,
// the file and CUDA's own message.
#pragma once

#include <cuda_runtime_api.h>

namespace stsa::cuda_detail {

// Throws ResourceError (out of memory), Unsupported (no device or driver) or Error,
// with `what` and CUDA's message. Clears the runtime's last-error slot first.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line);

// The current device; throws Unsupported when there is no usable GPU.
int current_device();

}  // namespace stsa::cuda_detail

#define STSA_CUDA_CHECK(expr)                                                                  \
  do {                                                                                         \
    const cudaError_t stsa_cuda_status_ = (expr);                                              \
    if (stsa_cuda_status_ != cudaSuccess)                                                      \
      ::stsa::cuda_detail::throw_cuda_error(stsa_cuda_status_, #expr, __FILE__, __LINE__);     \
  } while (0)
