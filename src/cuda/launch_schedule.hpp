// What one attention launch walks: its work order (work_items.hpp) and, for
// the persistent sm90 kernel, each block's list of items on the device
// (block_schedule.hpp). Chosen once per plan and launch shape and kept with the
// device plan, so a later launch of the same shape costs a lookup.
#pragma once

#include <cstdint>

#include "stsa/cuda.hpp"

namespace stsa::cuda_detail {

struct LaunchSchedule {
  int work_order = 0;                              // WorkOrder
  int heavy_ranks = 0;                             // the heavy-first order's (work_items.hpp)
  bool snake = false;                              // without lists: the snake walk (block_walk.hpp)
  int blocks = 0;                                  // persistent grid (sm90); 0 for sm80
  // The balanced schedule's lists on the device; null for round-robin and
  // snake, which the kernel walks by arithmetic (block_walk.hpp).
  const std::int32_t* block_item_begin = nullptr;  // device, [blocks + 1]
  const std::int32_t* block_items = nullptr;       // device, every item once
};

// `pairs` is batch x the heads of the launch; persistent_blocks > 0 is the most
// blocks a persistent launch may use. sm80 launches (persistent = false) get
// their order only: across heads unless head by head is asked for, the order
// their speed was measured in. Throws ResourceError when a persistent block
// would walk more key tiles than the kernel counts in 32 bits, or an sm80 grid
// (q_tiles x pairs blocks) would pass 2^31 - 1, and
// InvalidArgument when the shape's balanced schedule is not on the device yet
// and `may_upload` is false (the launch stream is being captured into a graph).
LaunchSchedule launch_schedule(const DevicePlan::Arrays& plan, const CudaBackendOptions& options, bool persistent,
                               std::int64_t pairs, int persistent_blocks, bool may_upload);

}  // namespace stsa::cuda_detail
