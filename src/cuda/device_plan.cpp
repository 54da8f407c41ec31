// Uploading a tile plan: its host image (device_plan_image.hpp) in one
// allocation and one copy.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "cuda/cuda_check.hpp"
#include "cuda/device_plan_arrays.hpp"
#include "cuda/device_plan_image.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {

DevicePlan::DevicePlan() : arrays_(std::make_unique<Arrays>()) {}

DevicePlan::~DevicePlan() {
  if (!arrays_ || !arrays_->storage) return;
  // A kernel queued by run_async may still read the plan: wait for the device
  // explicitly (cudaFree only "may" synchronize). Errors are ignored and
  // cleared: this may run at shutdown, and must not surface at a later launch.
  int current = -1;
  const bool switched = cudaGetDevice(&current) == cudaSuccess && current != arrays_->device &&
                        cudaSetDevice(arrays_->device) == cudaSuccess;
  cudaDeviceSynchronize();
  for (const Arrays::CachedSchedule& schedule : arrays_->schedules) cudaFree(schedule.storage);
  cudaFree(arrays_->storage);
  if (switched) cudaSetDevice(current);
  cudaGetLastError();
}

int DevicePlan::device() const { return arrays_->device; }
TileShape DevicePlan::tile() const { return arrays_->tile; }
std::int64_t DevicePlan::q_tiles() const { return arrays_->q_tiles; }
std::int64_t DevicePlan::kept_tiles() const { return arrays_->kept_tiles; }
std::int64_t DevicePlan::device_bytes() const {
  std::size_t bytes = arrays_->bytes;
  const std::lock_guard lock(arrays_->schedule_mutex);
  for (const Arrays::CachedSchedule& schedule : arrays_->schedules) bytes += schedule.bytes;
  return std::int64_t(bytes);
}

std::shared_ptr<const DevicePlan> DevicePlan::upload(const TilePlan& plan) {
  const int device = cuda_detail::current_device();
  cuda_detail::DevicePlanImage image = cuda_detail::make_device_plan_image(plan);
  std::shared_ptr<DevicePlan> result(new DevicePlan());
  Arrays& a = *result->arrays_;
  a.device = device;
  a.tile = plan.tile();
  a.q_tiles = image.q_tiles;
  a.kept_tiles = image.kept_tiles;
  a.distinct_masks = image.distinct_masks;
  a.rank_costs = std::move(image.rank_costs);
  STSA_CUDA_CHECK(cudaMalloc(&a.storage, image.bytes.size()));
  a.bytes = image.bytes.size();
  STSA_CUDA_CHECK(cudaMemcpy(a.storage, image.bytes.data(), a.bytes, cudaMemcpyHostToDevice));
  // A copy from pageable memory may return before its DMA has landed, and a
  // kernel on a non-blocking stream is not ordered after the legacy stream:
  // wait here, so every later launch on any stream sees the plan.
  STSA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  auto* base = static_cast<std::byte*>(a.storage);
  a.row_begin = reinterpret_cast<const std::int32_t*>(base + image.row_begin);
  a.partial_begin = reinterpret_cast<const std::int32_t*>(base + image.partial_begin);
  a.key_tiles = reinterpret_cast<const std::int32_t*>(base + image.key_tiles);
  a.mask_ids = reinterpret_cast<const std::int32_t*>(base + image.mask_ids);
  a.q_tile_order = reinterpret_cast<const std::int32_t*>(base + image.q_tile_order);
  a.masks = reinterpret_cast<const std::uint64_t*>(base + image.masks);
  return result;
}

}  // namespace stsa
