// A barrier wait that never completes on a Hopper GPU: the kernel reports it and
// traps after 5 s, and the host's error says which barrier, block, thread and
// parity (src/cuda/barrier_timeout.hpp). The trap ends this process's CUDA
// context, so this file holds this one test, run serially (tests/gpu/CMakeLists.txt).
#include <gtest/gtest.h>

#include <string>

#include "cuda/sm90_probe.hpp"
#include "gpu/gpu_support.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

TEST(GpuBarrierTimeout, AHungWaitTrapsAndSaysWhere) {
  STSA_REQUIRE_GPU();
  const CudaDeviceInfo info = cuda_device_info();
  if (info.major != 9 || info.minor != 0) GTEST_SKIP() << "the sm90 barriers need compute capability 9.0";
  try {
    cuda_detail::sm90_probe_barrier_timeout();
    FAIL() << "a wait for a phase nobody completes returned";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part : {"a barrier wait timed out", "block 0, thread 0 (warpgroup 0", "parity 0 of shared offset 24"})
      EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
  }
}

}  // namespace
}  // namespace stsa
