// Which work order a persistent launch should walk (CudaWorkOrder::Auto), from
// the modelled cost of its slowest block under the launch's block schedule
// (block_schedule.hpp). Plain C++ (no CUDA), tested in CI.
//
//   across heads: costs fall over the whole list, so both schedules stay balanced;
//   head by head: each head restarts at its heaviest tiles (a plan's anchor rows
//     can cost 20x a band row); round-robin can pile several of them on a few
//     blocks, the balanced schedule spreads them (the bound there is one item).
// Head by head shares one head's K/V in L2 across the running blocks, which the
// second H200 run measured at 6-18% faster once balance is taken out
// (bench/NOTES.md). So head by head is taken unless its slowest block is
// predicted to cost more than kHeadByHeadMaxImbalance times across heads'.
// That bound was fitted to that run's 15 Wan2.1 cases (720p, 1440p, 480p x 5
// densities, sm90-overlap, round-robin): it picks the faster measured order in
// all of them; the nearest cases on either side predicted 1.093 (head by head
// 8% faster) and 1.149 (4% slower).
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "cuda/block_schedule.hpp"
#include "cuda/work_items.hpp"
#include "stsa/cuda.hpp"

namespace stsa::cuda_detail {

constexpr double kHeadByHeadMaxImbalance = 1.12;

struct OrderChoice {
  WorkOrder order = kWorkHeadByHead;
  BlockSchedule schedule;  // the chosen order's
};

inline OrderChoice choose_work_order(std::span<const std::int32_t> rank_costs, std::int64_t pairs,
                                     std::int64_t blocks, CudaBlockSchedule policy) {
  BlockSchedule across = make_block_schedule(rank_costs, pairs, blocks, kWorkAcrossHeads, policy);
  BlockSchedule head_by_head = make_block_schedule(rank_costs, pairs, blocks, kWorkHeadByHead, policy);
  if (double(head_by_head.makespan) <= kHeadByHeadMaxImbalance * double(across.makespan))
    return {kWorkHeadByHead, std::move(head_by_head)};
  return {kWorkAcrossHeads, std::move(across)};
}

}  // namespace stsa::cuda_detail
