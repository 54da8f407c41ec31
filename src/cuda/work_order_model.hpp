// Which work order a persistent launch should walk (CudaWorkOrder::Auto), from
// a cost model of its static schedule. Plain C++ (no CUDA), tested in CI.
//
// The persistent sm90 kernel gives item i to block i % blocks, so a block's
// time is the sum of its items' costs (kept key tiles plus a fixed per-item
// cost) and the launch ends with its slowest block:
//   across heads: costs fall over the whole list, so round-robin stays balanced;
//   head by head: each head restarts at its heaviest tiles (a plan's anchor rows
//     can cost 20x a band row), and where those land on the blocks depends on
//     q_tiles % blocks: a few blocks can collect several heavy rows.
// Head by head shares one head's K/V in L2 across the running blocks, which the
// first H200 run measured at 8-18% faster at equal balance (bench/NOTES.md).
// So head by head is taken unless its slowest block is predicted to cost more
// than kHeadByHeadMaxImbalance times across heads' slowest block. That bound
// was fitted to the run's 15 Wan2.1 cases (720p, 1440p, 480p x 5 densities,
// sm90-overlap): it picks the faster measured order in all of them; the
// nearest cases on either side predicted 1.093 (head by head 8% faster) and
// 1.149 (4% slower).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/work_items.hpp"

namespace stsa::cuda_detail {

constexpr double kItemOverheadTiles = 2.0;  // Q load and epilogue of an item, in key-tile units
constexpr double kHeadByHeadMaxImbalance = 1.12;

// Cost of the slowest block of a launch of rank_costs.size() query tiles times
// `pairs` (batch x head slots) items over `blocks` persistent blocks, each item
// costing rank_costs[rank] + kItemOverheadTiles; rank_costs is in rank order.
inline double round_robin_makespan(std::span<const std::int32_t> rank_costs, std::int64_t pairs,
                                   std::int64_t blocks, WorkOrder order) {
  const auto q_tiles = std::int64_t(rank_costs.size());
  const std::int64_t items = q_tiles * pairs;
  blocks = std::clamp<std::int64_t>(blocks, 1, std::max<std::int64_t>(items, 1));
  std::vector<double> load(std::size_t(blocks), 0.0);
  std::int64_t block = 0;
  const auto add = [&](std::int64_t rank) {
    load[std::size_t(block)] += double(rank_costs[std::size_t(rank)]) + kItemOverheadTiles;
    if (++block == blocks) block = 0;
  };
  if (order == kWorkHeadByHead) {
    for (std::int64_t pair = 0; pair < pairs; ++pair)
      for (std::int64_t rank = 0; rank < q_tiles; ++rank) add(rank);
  } else {
    for (std::int64_t rank = 0; rank < q_tiles; ++rank)
      for (std::int64_t pair = 0; pair < pairs; ++pair) add(rank);
  }
  return *std::max_element(load.begin(), load.end());
}

inline WorkOrder choose_work_order(std::span<const std::int32_t> rank_costs, std::int64_t pairs,
                                   std::int64_t blocks) {
  if (rank_costs.empty() || pairs <= 0) return kWorkHeadByHead;
  const double across = round_robin_makespan(rank_costs, pairs, blocks, kWorkAcrossHeads);
  const double head_by_head = round_robin_makespan(rank_costs, pairs, blocks, kWorkHeadByHead);
  return head_by_head <= kHeadByHeadMaxImbalance * across ? kWorkHeadByHead : kWorkAcrossHeads;
}

}  // namespace stsa::cuda_detail
