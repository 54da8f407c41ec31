// From the sampled rows' scores to their weights, shared by both ways of
// computing the sampled attention (sampled_attention.cpp: fp32 vectors;
// sampled_attention_tiles.cpp: AMX tiles): the online softmax of one
// sub-chunk of scores, per-block sums, and a block's weights under a mask.
#pragma once

#include <cstdint>

#include "core/round_up.hpp"
#include "router/sampled_attention.hpp"

namespace stsa::router_detail {

inline constexpr std::int64_t kKeyBlock = CandidateMask::kBlock;  // keys per block
inline constexpr std::int64_t kLane = 16;  // channels per accumulator (one AVX-512 register)

// The length of a ChunkPartial::acc row: the head dim rounded up to whole lanes.
inline std::int64_t partial_dim(std::int64_t head_dim) { return round_up(head_dim, kLane); }

// Sum of one block of kKeyBlock weights: fp32 partial sums over 16 lanes (each
// adds kKeyBlock / 16 values in [0, 1]), then fp64 across the lanes.
double block_sum(const float* x);

// w[j] = e[j] where the mask allows (q, k0 + j), else 0, for the block's `len`
// real keys (the rest get 0); returns how many are allowed. code and forced
// point at the mask's entries for key k0.
std::int64_t masked_weights(const float* e, const std::int32_t* code, const std::uint8_t* forced,
                            std::int64_t q_code, bool q_forced, std::int64_t width, std::int64_t len, float* w);

// One sub-chunk of scores (`width` columns, a multiple of kKeyBlock, of which
// the first `len` are real keys; the rest need not be set) of rows 0 .. count - 1,
// row r at scores + r * stride, multiplied by `scale` and turned in place into
// weights exp(s - m) relative to each row's running maximum max[r] (0 past the
// real keys). factor[r] is what the row's earlier sums must be multiplied by:
// exp(old max - new max) when the maximum grew, else 1. A row with a non-finite
// score becomes NaN (max) with weights 0 from then on.
// sums[r * (width / kKeyBlock) + blk] = block_sum of the row's block blk.
void softmax_sub_chunk(float* scores, std::int64_t stride, std::int64_t count, std::int64_t len, std::int64_t width,
                       float scale, float* max, float* factor, double* sums);

// The rows' sums in o (`outputs` normalisers and acc_row floats of accumulators
// per row) multiplied by softmax_sub_chunk's factors.
void rescale_partial(ChunkPartial& o, std::size_t outputs, std::size_t acc_row, const float* factor);

}  // namespace stsa::router_detail
