// Which work items each block of a persistent sm90 launch walks, computed on
// the host from the plan's per-rank costs and uploaded with the launch
// (launch_schedule.hpp). Plain C++ (no CUDA), tested in CI.
//
// An item costs its kept key tiles plus kItemOverheadTiles (its Q load and
// epilogue), and a block's time is the sum of its items' costs:
//   RoundRobin: block b takes items b, b + G, b + 2G, ... of the walk order.
//     Balanced while costs fall over the whole list (across heads); head by
//     head restarts at each head's heaviest rows, and where those land depends
//     on q_tiles % G, so a few blocks can collect several of them.
//   Snake: round-robin with every other round handed out backwards
//     (block_walk.hpp): a block that took a round's heaviest item takes the
//     next round's lightest, so along costs that fall over the walk the blocks
//     stay side by side instead of drifting apart by the fall of each round.
//   Balanced: each item, in hand-out order, goes to the block whose items so
//     far cost least (ties: the lower block). That is greedy list scheduling:
//     what a dynamic scheduler with an atomic counter does when the costs are
//     right, without the atomic, the producer-to-consumer hand-off of the item,
//     or the drift of measured times from one run to the next. Its slowest
//     block costs at most the mean plus one heaviest item (Graham's bound),
//     whatever the order. The hand-out order is the walk order, or, when that
//     models a shorter makespan, the heavy items (kept tiles > 2x the median
//     rank's: the anchor rows) of every head first, then the rest, each group
//     in walk order. Head by head the walk meets each head's heavy rows at its
//     start, so the last head's come late with little light work behind them
//     (720p s = 0.1: 1.065x the mean in walk order, 1.007x heavy first).
// Each block walks its items in hand-out order: in walk order within each
// group, so the running blocks still share what the walk order makes them
// share (one head's K and V in L2; each head's heavy rows run side by side).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/block_walk.hpp"
#include "cuda/work_items.hpp"
#include "stsa/cuda.hpp"

namespace stsa::cuda_detail {

constexpr std::int64_t kItemOverheadTiles = 2;  // Q load and epilogue of an item, in key-tile units
// Every item costs something, so the first `blocks` hand-outs go to distinct
// blocks and no block of a launch is left without an item.
static_assert(kItemOverheadTiles > 0);

struct BlockSchedule {
  std::vector<std::int32_t> begin;  // [blocks + 1]: block b walks items[begin[b] .. begin[b + 1])
  std::vector<std::int32_t> items;  // every item of the launch once, each block's in walk order
  std::int64_t makespan = 0;        // modelled cost of the slowest block (key tiles + overheads)
  std::int64_t most_key_tiles = 0;  // kept key tiles of the block that walks the most (its K/V ring counter)
  bool heavy_first = false;         // Balanced handed the heavy items out first
  int heavy_ranks = 0;              // the heavy-first work order's (work_items.hpp); 0 for the others

  int blocks() const { return int(begin.size()) - 1; }
};

// The items of a launch of rank_costs.size() query tiles x `pairs` (batch x head
// slots) over min(blocks, items) blocks; rank_costs[r] is the kept key tiles of
// the query tile at rank r. Throws InvalidArgument on an empty launch and
// ResourceError past 2^31 - 1 items.
BlockSchedule make_block_schedule(std::span<const std::int32_t> rank_costs, std::int64_t pairs, std::int64_t blocks,
                                  WorkOrder order, CudaBlockSchedule policy);

// Items whose rank costs more than this are heavy: twice the median rank's
// cost (the upper median, element size / 2 of the sorted costs).
std::int64_t heavy_item_cost(std::span<const std::int32_t> rank_costs);

// The heavy-first work order's heavy ranks: the leading ranks (the costliest
// query tiles) that keep more than 1.5x the upper median rank's key tiles, the
// anchor rows of a video plan up to density ~0.6. Lower than heavy_item_cost's
// 2x: at 1440p s = 0.5 the anchor rows keep 1.8x the median (bench/NOTES.md).
int heavy_first_ranks(std::span<const std::int32_t> rank_costs);

// Whether the sm90 kernel's 32-bit counters hold the schedule: a block's item
// count and its running count of key tiles through the K/V ring, which sets
// stage and barrier parity. Few persistent blocks on a long sequence could pass 2^31.
bool fits_kernel_counters(const BlockSchedule& schedule);

}  // namespace stsa::cuda_detail
