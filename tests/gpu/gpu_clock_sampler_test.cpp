// The NVML clock sampler (src/bench/nvml_clocks.hpp) on the real driver: it
// finds the CUDA device by the bus id cuda_device_info() reports, and reads a
// clock within the board's range while a kernel keeps the GPU busy. Skipped
// without a GPU, and where the driver ships no NVML (the benchmarks then report
// no clocks, which the fake-library tests cover) unless STSA_GPU_REQUIRED is set.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>

#include "bench/nvml_clocks.hpp"
#include "gpu/gpu_support.hpp"
#include "stsa/cuda.hpp"

namespace stsa {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

TEST(GpuClockSampler, FindsTheCudaDeviceByItsBusIdAndReadsItsClock) {
  STSA_REQUIRE_GPU();
  const CudaDeviceInfo info = cuda_device_info();
  ASSERT_FALSE(info.pci_bus_id.empty());
  std::string why;
  auto sampler = bench::ClockSampler::open(info.pci_bus_id, &why);
  if (!sampler) {
    // open() says "cannot load <library>: ..." when the driver ships no NVML (as
    // bench/clock_sampler_test pins); anything else (init, the bus id, a first
    // reading) is a failure on a machine that has one.
    if (why.rfind("cannot load ", 0) == 0 && std::getenv("STSA_GPU_REQUIRED") == nullptr)
      GTEST_SKIP() << "no NVML here: " << why;
    FAIL() << "no clock sampler for " << info.pci_bus_id << ": " << why;
  }
  EXPECT_GT(sampler->board().max_sm_mhz, 0);
  EXPECT_GT(sampler->board().power_limit_w, 0);
  EXPECT_FALSE(sampler->board().name.empty());

  const double from = now_s();
  sampler->start(std::chrono::milliseconds(1));
  // About 0.1 s of memsets (2 GiB each, ~0.5 ms on an H200), so the samples see a busy GPU.
  const std::size_t bytes = std::size_t(2) << 30;
  DeviceBuffer buffer(bytes);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 20; ++i) ASSERT_EQ(cudaMemsetAsync(buffer.data(), i, bytes, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  sampler->stop();
  EXPECT_EQ(sampler->error(), "");
  const auto s = sampler->summary(from, now_s());
  ASSERT_TRUE(s.has_value());
  EXPECT_GE(s->samples, 10);
  EXPECT_GT(s->sm_mhz_min, 0);
  EXPECT_LE(s->sm_mhz_mean, sampler->board().max_sm_mhz);
  EXPECT_GT(s->power_w_mean, 0);
  EXPECT_LE(s->power_w_mean, 1.5 * sampler->board().power_limit_w);  // a short excursion over the limit, not garbage
  std::printf("%s at %s: SM %.0f-%.0f MHz (max %.0f), %.0f W (limit %.0f)\n", sampler->board().name.c_str(),
              info.pci_bus_id.c_str(), s->sm_mhz_min, s->sm_mhz_mean, sampler->board().max_sm_mhz, s->power_w_mean,
              sampler->board().power_limit_w);
}

}  // namespace
}  // namespace stsa
