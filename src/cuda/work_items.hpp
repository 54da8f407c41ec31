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
//     read one head's K and V (at 1440p one head's K and V are 3x the L2).
// CudaWorkOrder::Auto picks one per launch (work_order_model.hpp).
#pragma once

#include "cuda/host_device.hpp"

namespace stsa::cuda_detail {

enum WorkOrder : int { kWorkAcrossHeads = 0, kWorkHeadByHead = 1 };

struct WorkSlot {
  int rank, batch, head_slot;
};

// Item 0 <= item < q_tiles * batch * head_count of a launch.
STSA_HOST_DEVICE WorkSlot work_slot(int item, int q_tiles, int batch, int head_count, int order) {
  const int pairs = batch * head_count;
  int rank, pair;
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
