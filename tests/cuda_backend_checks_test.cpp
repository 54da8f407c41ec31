// The CudaBackend's checks that need no GPU (src/cuda/cuda_backend.cpp): a
// malformed call is InvalidArgument, with or without a device, and is named
// as what it is. Needs the CUDA backend's library, no GPU.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>

#include "stsa/attention.hpp"
#include "stsa/error.hpp"

#ifdef STSA_HAS_CUDA
#include "stsa/cuda.hpp"
#endif

namespace stsa {
namespace {

#ifdef STSA_HAS_CUDA

// A grid whose token count overflows 64 bits (here to exactly 2^31) is a
// malformed layout: the backend validates it before it compares the token
// count with its 32-bit limit, which would read a wrapped product (signed
// overflow) and call the layout merely too long for the kernel (Unsupported).
TEST(CudaBackendChecks, ALayoutWhoseTokenCountOverflowsIsInvalid) {
  AttentionCall call;
  call.layout.grid.frames = (std::int64_t(1) << 33) + 1;
  call.layout.grid.height = std::int64_t(1) << 31;
  const CudaBackend backend;
  const Support support = backend.supports(call);
  EXPECT_FALSE(support.ok);
  EXPECT_NE(support.why.find("exceeds the supported maximum"), std::string::npos) << support.why;
  EXPECT_THROW(backend.run(call), InvalidArgument);
}

// A valid layout past the kernels' 32-bit token index is still named as that,
// before the tensors are looked at.
TEST(CudaBackendChecks, AValidLayoutPastTheKernelsTokenIndexIsUnsupported) {
  AttentionCall call;
  call.layout.grid.height = INT_MAX - 100;
  const CudaBackend backend;
  const Support support = backend.supports(call);
  EXPECT_FALSE(support.ok);
  EXPECT_NE(support.why.find("32 bits"), std::string::npos) << support.why;
  EXPECT_THROW(backend.run(call), Unsupported);
}

#else

TEST(CudaBackendChecks, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace stsa
