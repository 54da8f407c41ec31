// CUDA events around each timed run on one stream, for the harness's timing
// loop: what the GPU benchmarks (stsa_gpu_bench, `stsa bench --backend cuda`)
// time with. Its own target (stsa_bench_cuda), built with the CUDA backend, so
// the rest of the bench room needs no CUDA; the handles are the runtime's own
// opaque types, declared here so that this header needs no CUDA header either.
//
// The start event waits behind a host gate (a host function on the stream that
// blocks until stop_ms() opens it), so the whole run is enqueued before the
// GPU reaches the start event: the host's checks and launch overhead fall
// outside the interval, which holds GPU time only (nvbench's blocking kernel,
// without a kernel). A run whose enqueue blocks on the device (it synchronizes,
// uploads a plan the cache lacked, or loads a module on first use) would wait
// for the gate; the gate gives up after 50 ms, and host_waits() counts those
// runs (their times then start at the give-up and include the host's time after it).
#pragma once

#include <memory>
#include <string>

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
  void start() override;   // closes the gate, enqueues it and the start event
  double stop_ms() override;  // opens the gate and waits for the run; a fault in it throws stsa::Error here

  // Timed runs whose gate gave up waiting (their enqueue blocked on the device).
  int host_waits() const;
  // One line for the user when host_waits() > 0 (what it means for the times), else empty.
  std::string host_waits_note() const;

 private:
  struct Gate;  // shared with the host function; defined in the .cpp

  CUstream_st* stream_;
  CUevent_st* start_ = nullptr;
  CUevent_st* stop_ = nullptr;
  std::unique_ptr<Gate> gate_;
};

}  // namespace stsa::bench
