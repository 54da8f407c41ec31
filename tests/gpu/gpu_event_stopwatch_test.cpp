// The GPU benchmarks' stopwatch (src/bench/cuda/event_stopwatch.hpp): the start
// event waits behind a host gate until the run is enqueued, so host time spent
// before the run's GPU work is not timed, while the GPU work itself is; a run
// that synchronizes with the device is still timed and is counted; a run that
// throws does not leave the stream held.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <cuda_runtime_api.h>

#include "bench/cuda/event_stopwatch.hpp"
#include "gpu/gpu_support.hpp"
#include "stsa/cuda.hpp"

namespace stsa {
namespace {

constexpr std::size_t kBytes = std::size_t(1) << 20;

TEST(GpuEventStopwatch, HostTimeBeforeTheGpuWorkIsNotTimed) {
  STSA_REQUIRE_GPU();
  DeviceBuffer buffer(kBytes);
  bench::CudaEventStopwatch events;
  events.settle();
  events.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(25));  // a slow host enqueue, within the gate's patience
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 0, kBytes, nullptr), cudaSuccess);
  const double ms = events.stop_ms();
  // Without the gate the interval would hold the 25 ms sleep; a 1 MB memset takes microseconds.
  EXPECT_GE(ms, 0.0);
  EXPECT_LT(ms, 10.0);
  EXPECT_EQ(events.host_waits(), 0);
}

TEST(GpuEventStopwatch, TheRunsGpuWorkIsTimed) {
  STSA_REQUIRE_GPU();
  // A 2 GiB memset (about 0.5 ms on an H200), timed with plain events on an idle
  // stream and with the gated stopwatch: the gate must not lose any of it.
  constexpr std::size_t kLarge = std::size_t(2) << 30;
  DeviceBuffer buffer(kLarge);
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 0, kLarge, nullptr), cudaSuccess);  // first touch, untimed
  cudaEvent_t begin = nullptr, end = nullptr;
  ASSERT_EQ(cudaEventCreate(&begin), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(begin, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 1, kLarge, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  float plain_ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&plain_ms, begin, end), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(begin), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(end), cudaSuccess);

  bench::CudaEventStopwatch events;
  events.start();
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 2, kLarge, nullptr), cudaSuccess);
  const double gated_ms = events.stop_ms();
  EXPECT_GT(plain_ms, 0.0f);
  EXPECT_GE(gated_ms, 0.5 * plain_ms) << "plain events: " << plain_ms << " ms";
  EXPECT_LE(gated_ms, 2.0 * plain_ms + 1.0) << "plain events: " << plain_ms << " ms";
  EXPECT_EQ(events.host_waits(), 0);
}

TEST(GpuEventStopwatch, ARunThatSynchronizesIsTimedAndCounted) {
  STSA_REQUIRE_GPU();
  DeviceBuffer buffer(kBytes);
  bench::CudaEventStopwatch events;
  events.start();
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 0, kBytes, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // waits out the gate's patience
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 1, kBytes, nullptr), cudaSuccess);
  const double ms = events.stop_ms();
  EXPECT_GE(ms, 0.0);
  EXPECT_EQ(events.host_waits(), 1);
  events.start();  // the next run is gated again, and is not counted
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 2, kBytes, nullptr), cudaSuccess);
  EXPECT_GE(events.stop_ms(), 0.0);
  EXPECT_EQ(events.host_waits(), 1);
}

TEST(GpuEventStopwatch, ARunThatThrowsLeavesTheStreamFree) {
  STSA_REQUIRE_GPU();
  DeviceBuffer buffer(kBytes);
  const auto begin = std::chrono::steady_clock::now();
  {
    bench::CudaEventStopwatch events;
    events.start();  // and no stop_ms(): the run threw
  }
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 0, kBytes, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The destructor opened the gate: the stream did not wait out its patience.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), 0.04);
}

TEST(GpuEventStopwatch, EveryGateIsOpenedBeforeTheNextStarts) {
  STSA_REQUIRE_GPU();
  DeviceBuffer buffer(kBytes);
  bench::CudaEventStopwatch events;
  for (int run = 0; run < 20; ++run) {
    events.start();
    ASSERT_EQ(cudaMemsetAsync(buffer.data(), run, kBytes, nullptr), cudaSuccess);
    EXPECT_GE(events.stop_ms(), 0.0);
  }
  EXPECT_EQ(events.host_waits(), 0);
}

}  // namespace
}  // namespace stsa
