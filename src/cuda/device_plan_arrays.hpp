// What a DevicePlan holds on the device: the plan's CSR lists as int32, the
// deduplicated partial bitmasks, the order in which query tiles are scheduled,
// and the block schedules of the launch shapes it has run with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cuda/launch_schedule.hpp"
#include "stsa/cuda.hpp"
#include "stsa/plan.hpp"

namespace stsa {

struct DevicePlan::Arrays {
  int device = -1;
  TileShape tile;
  std::int64_t q_tiles = 0;
  std::int64_t kept_tiles = 0;
  std::int64_t distinct_masks = 0;
  void* storage = nullptr;  // one cudaMalloc holding every array below
  std::size_t bytes = 0;

  const std::int32_t* row_begin = nullptr;      // [q_tiles + 1] offsets into key_tiles
  const std::int32_t* partial_begin = nullptr;  // [q_tiles] first partial entry of each row
  const std::int32_t* key_tiles = nullptr;      // [kept_tiles] full ones, then partial ones
  const std::int32_t* mask_ids = nullptr;       // [kept_tiles] parallel to key_tiles; -1 for full
  const std::uint64_t* masks = nullptr;         // [distinct_masks][tile.q][tile.k / 64]
  // [q_tiles] query tiles by descending kept-tile count: the heaviest work starts
  // first, so the light tiles fill the gaps at the end of a launch.
  const std::int32_t* q_tile_order = nullptr;

  // On the host: kept key tiles of the query tile at each rank (the block
  // schedules' costs, block_schedule.hpp).
  std::vector<std::int32_t> rank_costs;

  // The schedules of the launch shapes seen so far (launch_schedule.cpp), each
  // with its own device allocation, freed with the plan.
  struct CachedSchedule {
    std::int64_t pairs = 0;
    int persistent_blocks = 0;
    CudaWorkOrder order = CudaWorkOrder::Auto;
    CudaBlockSchedule policy = CudaBlockSchedule::Balanced;
    cuda_detail::LaunchSchedule launch;
    void* storage = nullptr;
    std::size_t bytes = 0;  // of storage
  };
  mutable std::mutex schedule_mutex;
  mutable std::vector<CachedSchedule> schedules;
};

}  // namespace stsa
