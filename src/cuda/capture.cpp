#include "cuda/capture.hpp"

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {

bool stream_is_capturing(void* stream, std::string_view who) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t asked = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
  if (asked == cudaErrorStreamCaptureImplicit) {  // the legacy stream, while a blocking stream is captured
    cudaGetLastError();                           // cleared: it must not fail a later launch check
    throw Unsupported(detail::concat(
        who, "the call is on the legacy default stream while another stream is being captured into a CUDA graph, "
             "and work there would invalidate that capture; use the capturing stream or a non-blocking one"));
  }
  STSA_CUDA_CHECK(asked);
  return status != cudaStreamCaptureStatusNone;
}

std::string capture_needs_warm_up(std::string_view what) {
  return detail::concat("the stream is being captured into a CUDA graph, and ", what,
                        " would allocate and copy synchronously, which invalidates the capture; make the same "
                        "call once before any capture begins (a warm-up of every shape the graph will hold)");
}

RelaxedCaptureScope::RelaxedCaptureScope() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  active_ = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  if (active_) {
    previous_ = int(mode);
  } else {
    cudaGetLastError();  // cleared: no runtime here, and the checks that follow say so
  }
}

RelaxedCaptureScope::~RelaxedCaptureScope() {
  if (!active_) return;
  auto mode = cudaStreamCaptureMode(previous_);
  cudaThreadExchangeStreamCaptureMode(&mode);
}

}  // namespace stsa::cuda_detail
