// The epilogue's stores, shared by the sm80 and sm90 kernels: where a row of O
// and its LSE go (a head of o/lse and a token position, output_order.hpp) and
// one pair of adjacent O elements in the output type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention_params.hpp"
#include "cuda/output_order.hpp"

namespace stsa::cuda_detail {

struct OutputRow {
  std::int64_t o = 0;    // element offset of the row's first element in p.o
  std::int64_t lse = 0;  // element offset of its LSE in p.lse
};

__device__ __forceinline__ OutputRow output_row(const AttentionParams& p, int batch, int head_slot, int token) {
  const std::int64_t head = p.o_heads[head_slot];
  const std::int64_t at = output_token(p.o_order, token);
  return {batch * p.o_stride[0] + at * p.o_stride[1] + head * p.o_stride[2],
          batch * p.lse_stride[0] + head * p.lse_stride[1] + at * p.lse_stride[2]};
}

// O[at], O[at + 1] = x, y (at even: the row's 16-byte alignment is checked on the host).
__device__ __forceinline__ void store_output_pair(const AttentionParams& p, std::int64_t at, float x, float y) {
  if (p.out_type == kOutF32) {
    *reinterpret_cast<float2*>(static_cast<float*>(p.o) + at) = make_float2(x, y);
  } else if (p.out_type == kOutBF16) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.o) + at) = __floats2bfloat162_rn(x, y);
  } else {
    *reinterpret_cast<__half2*>(static_cast<__half*>(p.o) + at) = __floats2half2_rn(x, y);
  }
}

}  // namespace stsa::cuda_detail
