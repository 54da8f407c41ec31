// Work order and block schedule of a launch, computed on the first launch of a
// shape and kept with the device plan (launch_schedule.hpp).
#include "cuda/launch_schedule.hpp"

#include <cuda_runtime_api.h>

#include <climits>
#include <cstddef>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/block_schedule.hpp"
#include "cuda/capture.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_plan_arrays.hpp"
#include "cuda/work_items.hpp"
#include "cuda/work_order_model.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

// A fixed work order as the kernels name it (Auto is resolved by the model).
WorkOrder fixed_order(CudaWorkOrder order) {
  switch (order) {
    case CudaWorkOrder::HeadByHead: return kWorkHeadByHead;
    case CudaWorkOrder::HeavyFirst: return kWorkHeavyFirst;
    default: return kWorkAcrossHeads;
  }
}

OrderChoice schedule_items(const DevicePlan::Arrays& plan, const CudaBackendOptions& options, std::int64_t pairs,
                           int persistent_blocks) {
  const CudaBlockSchedule policy = options.block_schedule;
  if (options.work_order == CudaWorkOrder::Auto)
    return choose_work_order(plan.rank_costs, pairs, persistent_blocks, policy);
  const WorkOrder order = fixed_order(options.work_order);
  return {order, make_block_schedule(plan.rank_costs, pairs, persistent_blocks, order, policy)};
}

// One allocation: begin, then items. A copy from pageable memory may return
// before its DMA has landed, and a kernel on a non-blocking stream is not
// ordered after the legacy stream: wait here, as the plan upload does.
std::pair<void*, std::size_t> upload(const BlockSchedule& schedule, LaunchSchedule& launch) {
  const std::size_t begin_bytes = schedule.begin.size() * sizeof(std::int32_t);
  const std::size_t items_bytes = schedule.items.size() * sizeof(std::int32_t);
  void* storage = nullptr;
  STSA_CUDA_CHECK(cudaMalloc(&storage, begin_bytes + items_bytes));
  auto* base = static_cast<std::int32_t*>(storage);
  const auto copy = [&] {
    STSA_CUDA_CHECK(cudaMemcpy(base, schedule.begin.data(), begin_bytes, cudaMemcpyHostToDevice));
    STSA_CUDA_CHECK(cudaMemcpy(base + schedule.begin.size(), schedule.items.data(), items_bytes,
                               cudaMemcpyHostToDevice));
    STSA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  };
  try {
    copy();
  } catch (...) {
    cudaFree(storage);
    throw;
  }
  launch.blocks = schedule.blocks();
  launch.block_item_begin = base;
  launch.block_items = base + schedule.begin.size();
  return {storage, begin_bytes + items_bytes};
}

}  // namespace

LaunchSchedule launch_schedule(const DevicePlan::Arrays& plan, const CudaBackendOptions& options, bool persistent,
                               std::int64_t pairs, int persistent_blocks, bool may_upload) {
  if (!persistent) {
    // One block per item, counted in 32 bits (attention_launch.cu): refused here,
    // before the call's first launch, rather than at this one's.
    STSA_CHECK(pairs > 0 && plan.q_tiles <= INT_MAX / pairs, ResourceError, "an sm80 attention launch of ",
               plan.q_tiles, " query tiles x ", pairs, " batch x heads has more blocks than one grid takes");
    LaunchSchedule launch;
    launch.work_order = fixed_order(options.work_order);
    if (launch.work_order == kWorkHeavyFirst) launch.heavy_ranks = heavy_first_ranks(plan.rank_costs);
    return launch;
  }
  const std::lock_guard lock(plan.schedule_mutex);
  for (const auto& cached : plan.schedules)
    if (cached.pairs == pairs && cached.persistent_blocks == persistent_blocks && cached.order == options.work_order &&
        cached.policy == options.block_schedule)
      return cached.launch;
  // Round-robin and snake are walked by arithmetic in the kernel (no list on
  // the device): only the balanced schedule's lists are uploaded.
  const bool uploads = options.block_schedule == CudaBlockSchedule::Balanced;
  STSA_CHECK(may_upload || !uploads, InvalidArgument,
             capture_needs_warm_up(detail::concat("the block schedule of this launch shape (", pairs,
                                                  " batch x heads, ", persistent_blocks, " persistent blocks, work "
                                                  "order ", to_string(options.work_order), ", ",
                                                  to_string(options.block_schedule), ")")));

  const OrderChoice choice = schedule_items(plan, options, pairs, persistent_blocks);
  STSA_CHECK(fits_kernel_counters(choice.schedule), ResourceError, "attention launch of ", choice.schedule.items.size(),
             " work items over ", choice.schedule.blocks(), " persistent blocks: one block walks ",
             choice.schedule.most_key_tiles,
             " key tiles, past the sm90 kernel's 32-bit counters; use more persistent blocks");
  plan.schedules.reserve(plan.schedules.size() + 1);  // nothing throws between the upload and its entry
  DevicePlan::Arrays::CachedSchedule cached;
  cached.pairs = pairs;
  cached.persistent_blocks = persistent_blocks;
  cached.order = options.work_order;
  cached.policy = options.block_schedule;
  cached.launch.work_order = choice.order;
  cached.launch.heavy_ranks = choice.schedule.heavy_ranks;
  cached.launch.snake = options.block_schedule == CudaBlockSchedule::Snake;
  if (uploads)
    std::tie(cached.storage, cached.bytes) = upload(choice.schedule, cached.launch);
  else
    cached.launch.blocks = choice.schedule.blocks();  // block_item_begin and block_items stay null
  plan.schedules.push_back(cached);
  return cached.launch;
}

}  // namespace stsa::cuda_detail
