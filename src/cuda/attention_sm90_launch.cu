// The sm90 kernel's instantiations (bf16 / fp16 x head dim 64 / 128 x the three
// consumer schedules), their TMA descriptors and the persistent launch (the
// grid of the launch's block schedule: at most one block per SM and per item).
#include <type_traits>

#include "cuda/attention_launch.hpp"
#include "cuda/attention_sm90_kernel.cuh"
#include "cuda/barrier_timeout.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/tensor_map.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

// setmaxnreg.inc waits until the registers it asks for are free in the block's
// allocation: if ptxas ever gave the kernel fewer registers per thread than the
// producer gives back and the consumers take, every block would hang before its
// first tile. A clear error instead (once per instantiation: a cached attribute).
template <class Traits>
void check_register_budget(const void* kernel) {
  static const int registers = [&] {
    cudaFuncAttributes attributes{};
    STSA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    return attributes.numRegs;
  }();
  constexpr int kNeeded = Traits::kProducerRegisters * 128 + Traits::kConsumerRegisters * 128 * Traits::kConsumerGroups;
  STSA_CHECK(registers * Traits::kThreads >= kNeeded, Error, "the sm90 attention kernel was built with ", registers,
             " registers per thread: its ", Traits::kThreads, " threads hold ", registers * Traits::kThreads,
             ", fewer than the ", kNeeded, " its warpgroups take after setmaxnreg; it would hang (rebuild with "
             "__launch_bounds__ giving at least ", (kNeeded + Traits::kThreads - 1) / Traits::kThreads, ")");
}

template <class Element, int kHeadDim, Sm90Schedule kSchedule>
void launch_sm90_typed(const AttentionParams& params, int blocks, cudaStream_t stream) {
  using Traits = Sm90Traits<Element, kHeadDim, kSchedule>;
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  Sm90AttentionParams launch;
  launch.common = params;
  const auto map = [&](const void* data, const std::int64_t(&stride)[3], int rows) {
    return make_row_tensor_map(data, kBf16, params.batch, params.tokens, params.total_heads, kHeadDim, stride, rows);
  };
  launch.q_map = map(params.q, params.q_stride, Traits::kBlockM);
  launch.k_map = map(params.k, params.k_stride, Traits::kBlockN);
  launch.v_map = map(params.v, params.v_stride, Traits::kBlockN);
  launch.barrier_timeout_report = barrier_timeout_slot(stream);

  const auto kernel = tile_sparse_attention_sm90_kernel<Traits>;
  check_register_budget<Traits>(reinterpret_cast<const void*>(kernel));
  STSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  kernel<<<unsigned(blocks), Traits::kThreads, Traits::kSmemBytes, stream>>>(launch);
  STSA_CUDA_CHECK(cudaGetLastError());
}

template <int kHeadDim, Sm90Schedule kSchedule>
void launch_sm90_dim(const AttentionParams& params, bool bf16_inputs, int blocks, cudaStream_t stream) {
  if (bf16_inputs)
    launch_sm90_typed<__nv_bfloat16, kHeadDim, kSchedule>(params, blocks, stream);
  else
    launch_sm90_typed<__half, kHeadDim, kSchedule>(params, blocks, stream);
}

template <Sm90Schedule kSchedule>
void launch_sm90_schedule(const AttentionParams& params, bool bf16_inputs, int blocks,
                          cudaStream_t stream) {
  switch (params.head_dim) {
    case 64: launch_sm90_dim<64, kSchedule>(params, bf16_inputs, blocks, stream); break;
    case 128: launch_sm90_dim<128, kSchedule>(params, bf16_inputs, blocks, stream); break;
    default:
      throw Unsupported(detail::concat("cuda sm90 attention: head dim ", params.head_dim, " (supported: 64, 128)"));
  }
}

}  // namespace

int attention_sm90_smem_bytes(int head_dim) {
  // Every schedule uses the same shared memory.
  return head_dim == 64 ? Sm90Traits<__nv_bfloat16, 64, Sm90Schedule::Serial>::kSmemBytes
                        : Sm90Traits<__nv_bfloat16, 128, Sm90Schedule::Serial>::kSmemBytes;
}

void launch_attention_sm90(const AttentionParams& params, bool bf16_inputs, int blocks,
                           Sm90Schedule schedule, void* stream) {
  using Any = Sm90Traits<__half, 128, Sm90Schedule::Serial>;
  static_assert(Any::kBlockM == kTileQ && Any::kBlockN == kTileK, "the kernel's tile is the plan tile it accepts");
  // Without lists (round-robin) the kernel walks its items by arithmetic.
  STSA_CHECK(blocks > 0 && (params.block_item_begin != nullptr) == (params.block_items != nullptr), InvalidArgument,
             "the sm90 attention launch needs a grid and either both block-schedule arrays or neither "
             "(launch_schedule.hpp)");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (schedule) {
    case Sm90Schedule::Serial:
      launch_sm90_schedule<Sm90Schedule::Serial>(params, bf16_inputs, blocks, cuda_stream);
      break;
    case Sm90Schedule::Overlap:
      launch_sm90_schedule<Sm90Schedule::Overlap>(params, bf16_inputs, blocks, cuda_stream);
      break;
    case Sm90Schedule::PingPong:
      launch_sm90_schedule<Sm90Schedule::PingPong>(params, bf16_inputs, blocks, cuda_stream);
      break;
  }
}

}  // namespace stsa::cuda_detail
