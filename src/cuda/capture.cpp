#include "cuda/capture.hpp"

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  STSA_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

std::string capture_needs_warm_up(std::string_view what) {
  return detail::concat("the stream is being captured into a CUDA graph, and ", what,
                        " would allocate and copy synchronously, which invalidates the capture; make the same "
                        "call once before any capture begins (a warm-up of every shape the graph will hold)");
}

}  // namespace stsa::cuda_detail
