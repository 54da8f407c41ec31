// Stream-ordered scratch memory for one call (the routing workspace, routed
// attention's packed temporal heads). It comes from a pool the library keeps
// per device and goes back to it on the call's stream, so once a size has been
// seen no call reaches the driver's allocator: cudaMalloc and cudaFree
// synchronize the whole device, and at 1440p the packed heads are gigabytes.
// cuda_scratch_bytes() / cuda_release_scratch() (cuda.hpp) report and return
// what the pool holds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace stsa::cuda_detail {

class StreamScratch {
 public:
  // `bytes` on the current device, usable by work enqueued on `stream` after
  // this point. Throws ResourceError when the device is out of memory.
  StreamScratch(std::size_t bytes, cudaStream_t stream);
  // Returns the memory on `stream`: work already enqueued there may still use it.
  ~StreamScratch();
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(data_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  bool pooled_ = false;
};

// Byte offsets of arrays carved from one scratch allocation, each 256-byte aligned.
struct ScratchLayout {
  std::size_t bytes = 0;
  std::size_t add(std::size_t size) {
    const std::size_t at = bytes;
    bytes += (size + 255) / 256 * 256;
    return at;
  }
};

}  // namespace stsa::cuda_detail
