// A diagnostic for the sm90 kernel's building blocks, used by the GPU tests:
// on one 128-row tile it runs exactly the kernel's TMA loads (same tensor maps,
// swizzle and barriers), its two wgmma products with the kernel's descriptors,
// and its fragment layouts, and writes the raw products out. If the attention
// kernel is wrong on a GPU, this says whether S = Q K^T or O = P V is.
#pragma once

namespace stsa::cuda_detail {

// q, k, v: device bf16 [128][head_dim] (row-major, contiguous); p: device bf16
// [128][128]; s_out: device fp32 [128][128] = q k^T; o_out: device fp32
// [128][head_dim] = p v. head_dim 64 or 128. Synchronous; throws on CUDA errors
// and Unsupported on GPUs other than compute capability 9.0.
void sm90_probe_products(const void* q, const void* k, const void* v, const void* p, float* s_out, float* o_out,
                         int head_dim);

// A kernel whose thread 0 waits on an mbarrier nobody arrives at, at shared
// offset 24 from the aligned base, for parity 0: after 5 s it reports the wait
// (barrier_timeout.hpp) and traps. Throws the resulting Error, whose message
// carries the report. It ENDS THE PROCESS'S CUDA CONTEXT: only for a test
// process of its own. Unsupported on GPUs other than compute capability 9.0.
void sm90_probe_barrier_timeout();

}  // namespace stsa::cuda_detail
