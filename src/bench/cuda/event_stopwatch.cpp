#include "bench/cuda/event_stopwatch.hpp"

#include <cuda_runtime_api.h>

#include "stsa/error.hpp"

namespace stsa::bench {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("CUDA error in ", what, ": ", cudaGetErrorString(status)));
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
