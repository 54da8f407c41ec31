// The attention kernel's instantiations (bf16 / fp16 x head dim 64 / 128) and
// their launch: the one place where run-time choices become template parameters.
#include "cuda/attention_kernel.cuh"
#include "cuda/attention_launch.hpp"
#include "cuda/cuda_check.hpp"
#include "stsa/error.hpp"

#include <climits>

namespace stsa::cuda_detail {
namespace {

template <class Element, int kHeadDim>
void launch_typed(const AttentionParams& params, cudaStream_t stream) {
  using Traits = AttentionTraits<Element, kHeadDim>;
  const auto kernel = tile_sparse_attention_kernel<Traits>;
  // Above 48 KB a block gets dynamic shared memory only after opting in.
  STSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const long long blocks = static_cast<long long>(params.q_tiles) * params.batch * params.head_count;
  STSA_CHECK(blocks > 0 && blocks <= INT_MAX, ResourceError, "attention grid of ", blocks,
             " blocks does not fit one launch");
  kernel<<<static_cast<unsigned>(blocks), Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  STSA_CUDA_CHECK(cudaGetLastError());
}

template <int kHeadDim>
void launch_dim(const AttentionParams& params, bool bf16_inputs, cudaStream_t stream) {
  if (bf16_inputs)
    launch_typed<__nv_bfloat16, kHeadDim>(params, stream);
  else
    launch_typed<__half, kHeadDim>(params, stream);
}

}  // namespace

bool attention_head_dim_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

int attention_smem_bytes(int head_dim) {
  // Same for bf16 and fp16 (both 2 bytes).
  return head_dim == 64 ? AttentionTraits<__nv_bfloat16, 64>::kSmemBytes
                        : AttentionTraits<__nv_bfloat16, 128>::kSmemBytes;
}

void launch_attention(const AttentionParams& params, bool bf16_inputs, int head_dim, void* stream) {
  static_assert(AttentionTraits<__half, 128>::kBlockM == kTileQ && AttentionTraits<__half, 128>::kTileN == kTileK,
                "the kernel's tile is the plan tile it accepts");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (head_dim) {
    case 64: launch_dim<64>(params, bf16_inputs, cuda_stream); break;
    case 128: launch_dim<128>(params, bf16_inputs, cuda_stream); break;
    default: throw Unsupported(detail::concat("cuda attention: head dim ", head_dim, " (supported: 64, 128)"));
  }
}

}  // namespace stsa::cuda_detail
