// FLOP and byte accounting shared by every benchmark (CPU and GPU), so that
// all figures mean the same thing.
#pragma once

#include <cstdint>

#include "stsa/layout.hpp"
#include "stsa/plan.hpp"

namespace stsa {

// Forward attention: QK^T and PV, 2 FLOPs per multiply-add each: 4 * pairs * D.
double attention_flops(std::int64_t pairs, std::int64_t head_dim);
// Dense: every pair of every (batch, head).
double dense_attention_flops(const VideoLayout& layout);
// What a tiled kernel executes with `plan` on every (batch, head): kept tile area, ragged edges excluded.
double kept_tile_flops(const VideoLayout& layout, const TilePlan& plan);
// What the call computes by definition with `plan` on every (batch, head): its kept pairs (after any
// rounding), whatever the tiles around them cost. The figure a FLOP counter reports.
double kept_pair_flops(const VideoLayout& layout, const TilePlan& plan);
// Bytes a permutation pass moves: read + write of `tensors` tensors of `heads` heads.
double permutation_bytes(const VideoLayout& layout, std::int64_t heads, int tensors, std::size_t element_bytes);

}  // namespace stsa
