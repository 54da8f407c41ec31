// Where an output disagrees with the fp64 reference, summarized by the parts a
// tiled kernel is made of: heads and batches, query tiles (with what their plan
// row holds), the row within a tile (which warpgroup, which 16-row warp slice),
// and the channel (64-wide blocks, 8-wide fragment groups). A failed GPU run
// gets one try per session; this text in its log says which part of the kernel
// to read, e.g. "only rows 64-127" (the second consumer warpgroup) or "only the
// last, ragged tile" or "only tiles with partial key tiles" (the bitmask path).
// For bit-exact results (the permutation), row_mismatch says which rows differ
// and which source row each holds instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stsa/attention.hpp"

namespace stsa::testing {

// The reference on some rows, as reference_rows() writes it: O [B, rows, H, D]
// and LSE [B, H, rows], row r of the arrays being tensor position rows[r].
struct ReferenceRows {
  std::vector<std::int64_t> rows;
  std::vector<double> o, lse;
};

// An O value is wrong when NaN, Inf or finiteness differ from the reference's
// or it is further than `o_bound` from it; an LSE value likewise with
// `lse_bound` (a reference of -inf, a row with no allowed key, must be -inf).
// Heads with compute == false are not looked at. Returns "" when nothing is
// wrong, else a few lines (each starting with two spaces) that say where.
std::string error_pattern(const AttentionCall& call, const ReferenceRows& reference, double o_bound,
                          double lse_bound);

// For results that must equal `expected` bit for bit (a permutation): "" when
// `got` does, else how many (batch, token, head) rows differ, the first, and
// which row of `source` it holds instead ("no source row" when none): a
// permutation bug shows as rows taken from the wrong place. Same shape and
// dtype for `expected` and `got`; `source` of the same dtype and head dim.
std::string row_mismatch(const TensorView& expected, const TensorView& got, const TensorView& source);

}  // namespace stsa::testing
