// Greedy list scheduling of a persistent launch's items (block_schedule.hpp).
#include "cuda/block_schedule.hpp"

#include <algorithm>
#include <climits>
#include <functional>
#include <queue>
#include <utility>

#include "stsa/error.hpp"

namespace stsa::cuda_detail {

BlockSchedule make_block_schedule(std::span<const std::int32_t> rank_costs, std::int64_t pairs, std::int64_t blocks,
                                  WorkOrder order, CudaBlockSchedule policy) {
  const auto q_tiles = std::int64_t(rank_costs.size());
  STSA_CHECK(q_tiles > 0 && pairs > 0 && blocks > 0, InvalidArgument, "a block schedule needs query tiles, heads and ",
             "blocks; got ", q_tiles, ", ", pairs, " and ", blocks);
  STSA_CHECK(q_tiles <= INT_MAX / pairs, ResourceError, "a launch of ", q_tiles, " query tiles x ", pairs,
             " heads has more work items than the sm90 kernel counts in 32 bits");
  const std::int64_t items = q_tiles * pairs;
  blocks = std::min(blocks, items);

  // Walk order: item i's rank as the kernel decodes it (both fit int: checked above).
  const auto rank_of = [&](std::int64_t item) { return work_slot(int(item), int(q_tiles), 1, int(pairs), order).rank; };
  std::vector<std::int32_t> block_of(static_cast<std::size_t>(items));
  std::vector<std::int64_t> load(std::size_t(blocks), 0), tiles(std::size_t(blocks), 0);
  const auto assign = [&](std::int64_t item, std::int64_t block) {
    const std::int32_t cost = rank_costs[std::size_t(rank_of(item))];
    block_of[std::size_t(item)] = std::int32_t(block);
    load[std::size_t(block)] += cost + kItemOverheadTiles;
    tiles[std::size_t(block)] += cost;
  };
  if (policy == CudaBlockSchedule::RoundRobin) {
    for (std::int64_t item = 0; item < items; ++item) assign(item, item % blocks);
  } else {
    // Least loaded first, then the lower block: (load, block) pairs in a min-heap.
    using Entry = std::pair<std::int64_t, std::int64_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> free_first;
    for (std::int64_t b = 0; b < blocks; ++b) free_first.push({0, b});
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t block = free_first.top().second;
      free_first.pop();
      assign(item, block);
      free_first.push({load[std::size_t(block)], block});
    }
  }

  BlockSchedule s;
  s.begin.assign(std::size_t(blocks) + 1, 0);
  for (const std::int32_t b : block_of) ++s.begin[std::size_t(b) + 1];
  for (std::size_t b = 0; b < std::size_t(blocks); ++b) s.begin[b + 1] += s.begin[b];
  s.items.resize(std::size_t(items));
  std::vector<std::int32_t> next(s.begin.begin(), s.begin.end() - 1);
  for (std::int64_t item = 0; item < items; ++item)
    s.items[std::size_t(next[std::size_t(block_of[std::size_t(item)])]++)] = std::int32_t(item);
  s.makespan = *std::max_element(load.begin(), load.end());
  s.most_key_tiles = *std::max_element(tiles.begin(), tiles.end());
  return s;
}

bool fits_kernel_counters(const BlockSchedule& schedule) { return schedule.most_key_tiles <= INT_MAX; }

}  // namespace stsa::cuda_detail
