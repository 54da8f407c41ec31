// Tile plans and token orders as NumPy arrays, for callers that run attention
// elsewhere (FlexAttention's BlockMask.from_kv_blocks takes the lists as they are).
#pragma once

#include <nanobind/nanobind.h>

#include "stsa/layout.hpp"
#include "stsa/plan.hpp"

namespace stsa::python {

// "kv_num_blocks" / "kv_indices": per query tile the partial key tiles ([Qt] and
// [Qt, Kt] int32, rows padded with 0), "full_kv_num_blocks" / "full_kv_indices"
// the full ones; "mask_ids" [Qt, Kt] int32, the partial tile's bitmask in "masks"
// ([M, tile_q, tile_k] uint8, 0 or 1; -1 where the tile is not partial); "tile" and
// "order", the token order the plan's positions are in.
nanobind::dict tile_lists(const TilePlan& plan);

// [N] int64: the frame-major position of the token at each position of `order`
// (x[..., order_positions, ...] gathers a frame-major tensor into `order`).
nanobind::object token_order(const VideoGrid& grid, TokenOrder order);

}  // namespace stsa::python
