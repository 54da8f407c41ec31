// Which query tile of which (batch, head) a work item of an attention launch
// is. A launch has one item per (query tile, batch entry, head slot); rank r
// names the r-th heaviest query tile of the plan (q_tile_order). The persistent
// sm90 kernel's blocks walk their items in this order (block_schedule.hpp), the
// sm80 grid launches them in it, so the order decides what shares L2 and, with
// the block schedule, the balance:
//   across heads: rank slowest, the heaviest tiles of every head first; costs
//     fall monotonically over the whole list;
//   head by head: (batch, head slot) slowest, every tile of one head
//     (heaviest first) before the next, so the blocks running at one moment
//     read one head's K and V (at 1440p one head's K and V are 3x the L2);
//   heavy first: ranks below heavy_ranks (the heavy tiles, a prefix of the
//     ranks) across heads, then the other ranks head by head.
// CudaWorkOrder::Auto picks one per launch (work_order_model.hpp).
#pragma once

#include "cuda/host_device.hpp"

namespace stsa::cuda_detail {

enum WorkOrder : int { kWorkAcrossHeads = 0, kWorkHeadByHead = 1, kWorkHeavyFirst = 2 };

struct WorkSlot {
  int rank, batch, head_slot;
};

// Item 0 <= item < q_tiles * batch * head_count of a launch; heavy_ranks in
// [0, q_tiles] is read by the heavy-first order only.
STSA_HOST_DEVICE WorkSlot work_slot(int item, int q_tiles, int batch, int head_count, int order, int heavy_ranks) {
  const int pairs = batch * head_count;
  int rank, pair;
  if (order == kWorkHeavyFirst && item < heavy_ranks * pairs) {
    order = kWorkAcrossHeads;  // the heavy ranks of every pair
  } else if (order == kWorkHeavyFirst) {
    const int rest = item - heavy_ranks * pairs, light_ranks = q_tiles - heavy_ranks;
    pair = rest / light_ranks;
    return {heavy_ranks + (rest - pair * light_ranks), pair / head_count, pair % head_count};
  }
  if (order == kWorkHeadByHead) {
    pair = item / q_tiles;
    rank = item - pair * q_tiles;
  } else {
    rank = item / pairs;
    pair = item - rank * pairs;
  }
  return {rank, pair / head_count, pair % head_count};
}

}  // namespace stsa::cuda_detail
