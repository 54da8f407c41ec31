// CUDA events around each timed run on one stream, for the harness's timing
// loop: what the GPU benchmarks (stsa_gpu_bench, `stsa bench --backend cuda`)
// time with. Its own target (stsa_bench_cuda), built with the CUDA backend, so
// the rest of the bench room needs no CUDA; the handles are the runtime's own
// opaque types, declared here so that this header needs no CUDA header either.
#pragma once

#include "bench/stopwatch.hpp"

struct CUevent_st;   // cudaEvent_t
struct CUstream_st;  // cudaStream_t

namespace stsa::bench {

class CudaEventStopwatch final : public Stopwatch {
 public:
  // `stream`: where the timed work is enqueued; nullptr: the legacy default stream.
  // Throws stsa::Error when the events cannot be created (no device, for one).
  explicit CudaEventStopwatch(CUstream_st* stream = nullptr);
  ~CudaEventStopwatch() override;
  CudaEventStopwatch(const CudaEventStopwatch&) = delete;
  CudaEventStopwatch& operator=(const CudaEventStopwatch&) = delete;

  void settle() override;  // waits for the device: warm-up runs end before the first timed one
  void start() override;
  double stop_ms() override;  // waits for the run; a fault in it throws stsa::Error here

 private:
  CUstream_st* stream_;
  CUevent_st* start_ = nullptr;
  CUevent_st* stop_ = nullptr;
};

}  // namespace stsa::bench
