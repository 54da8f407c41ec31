// Moving data between the caller's strided tensors (fp32, bf16 or f16, any
// strides) and the contiguous fp32 panels the kernels read and write.
#pragma once

#include <cstdint>

#include "stsa/tensor.hpp"

namespace stsa::cpu {

// Reads row (b, n, h, :) of t as head_dim floats, each multiplied by `scale`.
void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, float scale, float* out);

// Two values as one uint32 of bf16 bits: `low` in bits 0-15, `high` in 16-31
// (the operand order of VDPBF16PS). Exact for values that are bf16 already.
inline std::uint32_t bf16_pair(float low, float high) {
  return std::uint32_t(float_to_bf16(low)) | (std::uint32_t(float_to_bf16(high)) << 16);
}

// Packs key tile `tile` of (b, h): K transposed into kt [head_dim][tile_k] (or,
// when kt_pairs is given, as bf16 pairs of channels into kt_pairs
// [head_dim / 2][tile_k]; kt is then unused and may be null) and V into v
// [tile_k][head_dim], and when v_pairs is given also as bf16 pairs of consecutive
// keys into v_pairs [tile_k / 2][head_dim]; all zero past the sequence end.
// Returns whether the packed V holds a non-finite value.
bool pack_kv_tile(const TensorView& k, const TensorView& v, std::int64_t b, std::int64_t h, std::int64_t tile,
                  int tile_k, float* kt, float* v_rows, std::uint32_t* kt_pairs = nullptr,
                  std::uint32_t* v_pairs = nullptr);

// Writes finished rows: o[b, n0 + i, h, :] = acc[i] / l[i] and
// lse[b, h, n0 + i] = m[i] * score_scale + ln l[i], from the kernel's running max
// m of the unscaled scores and sum l. A row with l == 0 (nothing allowed) gets
// O = 0 and LSE = -inf.
void store_rows(const TensorView& o, const LseView& lse, std::int64_t b, std::int64_t h, std::int64_t n0, int rows,
                const float* acc, const float* m, const float* l, double score_scale);

}  // namespace stsa::cpu
