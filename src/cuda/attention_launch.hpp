// Where run-time choices (input dtype, head dim) become template parameters of
// the attention kernels. Plain C++ interface, implemented in attention_launch.cu
// (sm80) and attention_sm90_launch.cu (sm90).
#pragma once

#include "cuda/attention_params.hpp"

namespace stsa::cuda_detail {

// The kernel's fixed tile shape: it consumes plans of exactly this shape.
constexpr int kTileQ = 128;
constexpr int kTileK = 128;

bool attention_head_dim_supported(int head_dim);  // 64 or 128
// Dynamic shared memory one block of the kernel needs.
int attention_smem_bytes(int head_dim);
// Launches one grid of q_tiles * batch * head_count blocks. Throws Error with
// CUDA's message when the launch fails.
void launch_attention(const AttentionParams& params, bool bf16_inputs, int head_dim, void* stream);

// The Hopper kernel (sm_90a only): dynamic shared memory per block, and the
// persistent launch of `blocks` blocks, each walking its items of
// params.block_items (block_schedule.hpp, launch_schedule.hpp). Builds the TMA
// descriptors of q, k, v from params (head_dim, total_heads and strides set).
int attention_sm90_smem_bytes(int head_dim);

// How the sm90 consumer warpgroups schedule a tile's two products.
//   Serial: S, softmax, P V, each waited for before the next.
//   Overlap: S(t) in flight together with P V(t-1) (intra-warpgroup overlap).
//   PingPong: Overlap, and the two consumer warpgroups take turns issuing their
//             products, so one's softmax runs under the other's products.
enum class Sm90Schedule { Serial, Overlap, PingPong };
void launch_attention_sm90(const AttentionParams& params, bool bf16_inputs, int blocks, Sm90Schedule schedule,
                           void* stream);

}  // namespace stsa::cuda_detail
