// The bytes a DevicePlan uploads, built on the host: the plan's CSR lists as
// int32, the longest-first order of query tiles and the partial bitmasks, each
// array 256-byte aligned in one buffer. Plain C++ (no CUDA), so CI tests it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stsa/plan.hpp"

namespace stsa::cuda_detail {

struct DevicePlanImage {
  std::vector<std::byte> bytes;  // what one cudaMemcpy uploads
  // Byte offsets of the arrays inside `bytes`.
  std::size_t row_begin = 0, partial_begin = 0, key_tiles = 0, mask_ids = 0, q_tile_order = 0, masks = 0;
  std::int64_t q_tiles = 0, kept_tiles = 0, distinct_masks = 0;
  // Kept key tiles of the query tile at each rank of q_tile_order (stays on the
  // host: the block schedules read it, block_schedule.hpp).
  std::vector<std::int32_t> rank_costs;
};

// Throws ResourceError when the plan does not fit 32-bit tile lists.
DevicePlanImage make_device_plan_image(const TilePlan& plan);

}  // namespace stsa::cuda_detail
