#include "cuda/stream_scratch.hpp"

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>

#include "cuda/cuda_check.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace cuda_detail {
namespace {

// The library's pool on `device`, created on first use; nullptr where the
// device has no stream-ordered allocator (then scratch is plain cudaMalloc).
// Pools live as long as the process: destroying one at static destruction
// could run after the CUDA runtime has shut down.
cudaMemPool_t scratch_pool(int device) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard lock(mutex);
  if (const auto found = pools.find(device); found != pools.end()) return found->second;
  int supported = 0;
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  cudaMemPool_t pool = nullptr;
  if (supported != 0) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    // Keep what was freed: the next call of the same shape needs it again.
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
      pool = nullptr;  // the attribute said yes, the environment (e.g. a virtualized GPU) says no
    } else if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
      cudaMemPoolDestroy(pool);  // a pool that gives memory back at every sync is no better than cudaMalloc
      pool = nullptr;
    }
    cudaGetLastError();  // cleared: a refused pool must not fail a later launch check
  }
  pools.emplace(device, pool);
  return pool;
}

}  // namespace

StreamScratch::StreamScratch(std::size_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
  const cudaMemPool_t pool = scratch_pool(current_device());
  if (bytes == 0) return;
  pooled_ = pool != nullptr;
  if (pooled_)
    STSA_CUDA_CHECK(cudaMallocFromPoolAsync(&data_, bytes, pool, stream));
  else
    STSA_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

StreamScratch::~StreamScratch() {
  if (data_ == nullptr) return;
  if (pooled_) {
    cudaFreeAsync(data_, stream_);  // errors ignored: nothing useful to do in a destructor,
  } else {
    cudaStreamSynchronize(stream_);  // work enqueued on the stream may still read it
    cudaFree(data_);
  }
  cudaGetLastError();  // and cleared: they must not fail a later launch check
}

}  // namespace cuda_detail

std::int64_t cuda_scratch_bytes() {
  const cudaMemPool_t pool = cuda_detail::scratch_pool(cuda_detail::current_device());
  if (pool == nullptr) return 0;
  std::uint64_t reserved = 0;
  STSA_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  return std::int64_t(reserved);
}

void cuda_release_scratch() {
  const cudaMemPool_t pool = cuda_detail::scratch_pool(cuda_detail::current_device());
  if (pool == nullptr) return;
  STSA_CUDA_CHECK(cudaDeviceSynchronize());  // frees still queued on streams complete first
  STSA_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
}

}  // namespace stsa
