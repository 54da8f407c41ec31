#include "bench/cuda/event_stopwatch.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"

namespace stsa::bench {

struct CudaEventStopwatch::Gate {
  // Long enough for any host-side enqueue (a call's checks and its launches
  // take well under a millisecond), short enough that a run which
  // synchronizes costs little (the benchmarks time up to a few hundred runs).
  static constexpr std::chrono::milliseconds patience{50};

  std::mutex mutex;
  std::condition_variable opened;
  bool open = true;
  int gave_up = 0;

  // Runs on the driver's callback thread; must make no CUDA call.
  static void CUDART_CB hold(void* self) {
    auto& gate = *static_cast<Gate*>(self);
    std::unique_lock lock(gate.mutex);
    if (!gate.opened.wait_for(lock, patience, [&] { return gate.open; })) ++gate.gave_up;
  }
  void set(bool value) {
    {
      std::lock_guard lock(mutex);
      open = value;
    }
    if (value) opened.notify_all();
  }
};

namespace {

// The library's translation: the error cleared, the exception type by status,
// and a hung barrier's report (barrier_timeout.hpp) in the message.
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) cuda_detail::throw_cuda_error(status, what, __FILE__, __LINE__);
}

}  // namespace

CudaEventStopwatch::CudaEventStopwatch(CUstream_st* stream) : stream_(stream), gate_(std::make_unique<Gate>()) {
  check(cudaEventCreate(&start_), "cudaEventCreate");
  const cudaError_t status = cudaEventCreate(&stop_);
  if (status != cudaSuccess) cudaEventDestroy(start_);
  check(status, "cudaEventCreate");
}

CudaEventStopwatch::~CudaEventStopwatch() {
  // A run that threw between start() and stop_ms() leaves the gate closed and
  // its host function pending: open it, and keep the gate alive (leak it) if
  // the stream cannot be drained, since the driver may still call into it.
  gate_->set(true);
  if (cudaStreamSynchronize(stream_) != cudaSuccess) {
    cudaGetLastError();
    (void)gate_.release();
  }
  cudaEventDestroy(start_);  // errors ignored in a destructor
  cudaEventDestroy(stop_);
}

void CudaEventStopwatch::settle() { check(cudaDeviceSynchronize(), "warm-up"); }

void CudaEventStopwatch::start() {
  gate_->set(false);
  const cudaError_t status = cudaLaunchHostFunc(stream_, &Gate::hold, gate_.get());
  if (status != cudaSuccess) gate_->set(true);
  check(status, "cudaLaunchHostFunc");
  check(cudaEventRecord(start_, stream_), "cudaEventRecord");
}

double CudaEventStopwatch::stop_ms() {
  // The stop event is queued before the gate opens, so a host thread descheduled
  // in between cannot add its delay to a short run; the gate opens even if the
  // record failed, so the stream is never left held.
  const cudaError_t recorded = cudaEventRecord(stop_, stream_);
  gate_->set(true);
  check(recorded, "cudaEventRecord");
  check(cudaEventSynchronize(stop_), "timed run");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
  return ms;
}

int CudaEventStopwatch::host_waits() const {
  std::lock_guard lock(gate_->mutex);
  return gate_->gave_up;
}

std::string CudaEventStopwatch::host_waits_note() const {
  const int waits = host_waits();
  if (waits == 0) return "";
  return std::to_string(waits) + " timed run(s) blocked on the device while enqueuing (a sync, a plan upload or a " +
         "module load); their times include host time";
}

}  // namespace stsa::bench
