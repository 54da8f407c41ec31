// Greedy list scheduling of a persistent launch's items (block_schedule.hpp).
#include "cuda/block_schedule.hpp"

#include <algorithm>
#include <climits>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

#include "stsa/error.hpp"

namespace stsa::cuda_detail {

namespace {

// The lists of a schedule in which block_of[k] took handed_out[k], in that order.
BlockSchedule lists_of(std::span<const std::int64_t> handed_out, std::span<const std::int32_t> block_of,
                       std::span<const std::int64_t> item_cost, std::int64_t blocks) {
  BlockSchedule s;
  s.begin.assign(std::size_t(blocks) + 1, 0);
  for (const std::int32_t b : block_of) ++s.begin[std::size_t(b) + 1];
  for (std::size_t b = 0; b < std::size_t(blocks); ++b) s.begin[b + 1] += s.begin[b];
  s.items.resize(handed_out.size());
  std::vector<std::int32_t> next(s.begin.begin(), s.begin.end() - 1);
  std::vector<std::int64_t> load(std::size_t(blocks), 0), tiles(std::size_t(blocks), 0);
  for (std::size_t k = 0; k < handed_out.size(); ++k) {
    const auto b = std::size_t(block_of[k]);
    s.items[std::size_t(next[b]++)] = std::int32_t(handed_out[k]);
    load[b] += item_cost[std::size_t(handed_out[k])] + kItemOverheadTiles;
    tiles[b] += item_cost[std::size_t(handed_out[k])];
  }
  s.makespan = *std::max_element(load.begin(), load.end());
  s.most_key_tiles = *std::max_element(tiles.begin(), tiles.end());
  return s;
}

// Greedy list scheduling: each item, in the order given, to the least loaded
// block (ties: the lower one), via (load, block) pairs in a min-heap.
BlockSchedule greedy(std::span<const std::int64_t> handed_out, std::span<const std::int64_t> item_cost,
                     std::int64_t blocks) {
  using Entry = std::pair<std::int64_t, std::int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> free_first;
  for (std::int64_t b = 0; b < blocks; ++b) free_first.push({0, b});
  std::vector<std::int32_t> block_of(handed_out.size());
  for (std::size_t k = 0; k < handed_out.size(); ++k) {
    const auto [load, block] = free_first.top();
    free_first.pop();
    block_of[k] = std::int32_t(block);
    free_first.push({load + item_cost[std::size_t(handed_out[k])] + kItemOverheadTiles, block});
  }
  return lists_of(handed_out, block_of, item_cost, blocks);
}

// The upper median of the rank costs (element size / 2 of the sorted costs); 0 for none.
std::int64_t upper_median(std::span<const std::int32_t> rank_costs) {
  std::vector<std::int32_t> sorted(rank_costs.begin(), rank_costs.end());
  if (sorted.empty()) return 0;
  const auto middle = sorted.begin() + std::ptrdiff_t(sorted.size() / 2);
  std::nth_element(sorted.begin(), middle, sorted.end());
  return *middle;
}

}  // namespace

std::int64_t heavy_item_cost(std::span<const std::int32_t> rank_costs) { return 2 * upper_median(rank_costs); }

BlockSchedule make_block_schedule(std::span<const std::int32_t> rank_costs, std::int64_t pairs, std::int64_t blocks,
                                  WorkOrder order, CudaBlockSchedule policy) {
  const auto q_tiles = std::int64_t(rank_costs.size());
  STSA_CHECK(q_tiles > 0 && pairs > 0 && blocks > 0, InvalidArgument, "a block schedule needs query tiles, heads and ",
             "blocks; got ", q_tiles, ", ", pairs, " and ", blocks);
  STSA_CHECK(q_tiles <= INT_MAX / pairs, ResourceError, "a launch of ", q_tiles, " query tiles x ", pairs,
             " heads has more work items than the sm90 kernel counts in 32 bits");
  const std::int64_t items = q_tiles * pairs;
  blocks = std::min(blocks, items);

  // Each item's kept key tiles, its rank as the kernel decodes it (both fit int: checked above).
  const int heavy_ranks = order == kWorkHeavyFirst ? heavy_first_ranks(rank_costs) : 0;
  std::vector<std::int64_t> item_cost(static_cast<std::size_t>(items));
  for (std::int64_t item = 0; item < items; ++item)
    item_cost[std::size_t(item)] =
        rank_costs[std::size_t(work_slot(int(item), int(q_tiles), 1, int(pairs), order, heavy_ranks).rank)];
  std::vector<std::int64_t> walk(static_cast<std::size_t>(items));
  std::iota(walk.begin(), walk.end(), std::int64_t(0));

  if (policy == CudaBlockSchedule::RoundRobin || policy == CudaBlockSchedule::Snake) {
    // The kernel's own arithmetic (block_walk.hpp), so the model walks what it walks.
    std::vector<std::int32_t> block_of(walk.size(), -1);
    for (std::int64_t b = 0; b < blocks; ++b) {
      const BlockWalk w = block_walk(int(items), int(b), int(blocks), policy == CudaBlockSchedule::Snake);
      for (int k = 0; k < w.count; ++k) block_of[std::size_t(w.at(k))] = std::int32_t(b);
    }
    BlockSchedule s = lists_of(walk, block_of, item_cost, blocks);
    s.heavy_ranks = heavy_ranks;
    return s;
  }
  BlockSchedule in_walk_order = greedy(walk, item_cost, blocks);
  in_walk_order.heavy_ranks = heavy_ranks;
  // The heavy items first, each group in walk order (stable).
  const std::int64_t heavy = heavy_item_cost(rank_costs);
  std::vector<std::int64_t> heavy_first = walk;
  std::stable_partition(heavy_first.begin(), heavy_first.end(),
                        [&](std::int64_t item) { return item_cost[std::size_t(item)] > heavy; });
  if (heavy_first == walk) return in_walk_order;  // none heavy, all heavy, or heavy already first
  BlockSchedule s = greedy(heavy_first, item_cost, blocks);
  if (s.makespan >= in_walk_order.makespan) return in_walk_order;
  s.heavy_first = true;
  s.heavy_ranks = heavy_ranks;
  return s;
}

int heavy_first_ranks(std::span<const std::int32_t> rank_costs) {
  const std::int64_t median = upper_median(rank_costs);
  int ranks = 0;
  while (ranks < int(rank_costs.size()) && 2 * std::int64_t(rank_costs[std::size_t(ranks)]) > 3 * median) ++ranks;
  return ranks;
}

bool fits_kernel_counters(const BlockSchedule& schedule) { return schedule.most_key_tiles <= INT_MAX; }

}  // namespace stsa::cuda_detail
