#include "bench/cuda/event_stopwatch.hpp"

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"

namespace stsa::bench {
namespace {

// The library's translation: the error cleared, the exception type by status,
// and a hung barrier's report (barrier_timeout.hpp) in the message.
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) cuda_detail::throw_cuda_error(status, what, __FILE__, __LINE__);
}

}  // namespace

CudaEventStopwatch::CudaEventStopwatch(CUstream_st* stream) : stream_(stream) {
  check(cudaEventCreate(&start_), "cudaEventCreate");
  const cudaError_t status = cudaEventCreate(&stop_);
  if (status != cudaSuccess) cudaEventDestroy(start_);
  check(status, "cudaEventCreate");
}

CudaEventStopwatch::~CudaEventStopwatch() {
  cudaEventDestroy(start_);  // errors ignored in a destructor
  cudaEventDestroy(stop_);
}

void CudaEventStopwatch::settle() { check(cudaDeviceSynchronize(), "warm-up"); }

void CudaEventStopwatch::start() { check(cudaEventRecord(start_, stream_), "cudaEventRecord"); }

double CudaEventStopwatch::stop_ms() {
  check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
  check(cudaEventSynchronize(stop_), "timed run");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
  return ms;
}

}  // namespace stsa::bench
