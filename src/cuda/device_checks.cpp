#include "cuda/device_checks.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/capture.hpp"
#include "cuda/cuda_check.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {

void require_device_memory(std::string_view who, std::string_view name,
                           std::pair<const std::byte*, const std::byte*> extent, int device, std::string_view hint) {
  if (extent.first == extent.second) return;  // nothing to read or write (a zero-sized view)
  const RelaxedCaptureScope relaxed;  // a query must not invalidate a caller's graph capture
  for (const std::byte* address : {extent.first, extent.second - 1}) {
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, address);
    if (status != cudaSuccess) {
      cudaGetLastError();  // cleared: it must not fail a later launch check
      // Only an unknown address is the caller's pointer; anything else (a context an
      // earlier kernel fault left unusable, which no clearing resets) is the runtime's.
      if (status != cudaErrorInvalidValue) throw_cuda_error(status, "cudaPointerGetAttributes", __FILE__, __LINE__);
      throw Unsupported(detail::concat(who, name, " is not an address the CUDA runtime knows (",
                                       cudaGetErrorString(status), "); ", hint));
    }
    STSA_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged, Unsupported,
               who, name, " is host memory, or runs past its device allocation; ", hint);
    STSA_CHECK(attributes.device == device, Unsupported, who, name, " lives on CUDA device ", attributes.device,
               " but the current device is ", device);
  }
}

void require_row_vectors(std::string_view who, std::string_view name, const TensorView& t) {
  STSA_CHECK(t.stride[3] == 1, Unsupported, who, name, " has head-dim stride ", t.stride[3],
             "; rows must be contiguous (head-dim stride 1)");
  STSA_CHECK(reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0, Unsupported, who, name,
             " is not 16-byte aligned; rows are loaded as 16-byte vectors");
  static constexpr const char* kDims[3] = {"batch", "token", "head"};
  const auto element = std::int64_t(element_size(t.dtype));
  for (int i = 0; i < 3; ++i)
    STSA_CHECK(t.shape[i] == 1 || t.stride[i] * element % 16 == 0, Unsupported, who, name, " has a ", kDims[i],
               " stride of ", t.stride[i] * element, " bytes; rows must start at multiples of 16 bytes");
}

void refuse_grouped_kv(std::string_view who, const TensorView& k, std::int64_t heads) {
  const bool grouped = k.heads() >= 1 && k.heads() < heads && heads % k.heads() == 0;
  STSA_CHECK(!grouped, Unsupported, who, "no grouped-query attention on the GPU yet (k and v with ", k.heads(),
             " heads for q's ", heads, "; the cpu and reference backends take it): repeat each K/V head for its ",
             "query heads");
}

}  // namespace stsa::cuda_detail
