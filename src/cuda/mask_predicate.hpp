// The candidate-mask predicate of stsa::allowed() (mask.hpp) in a form the
// routing kernels evaluate on the device. Plain C++17 with 32-bit arithmetic
// (a grid holds at most 2^31 - 1 tokens), no stsa headers, so the same code
// compiles for the host and is tested there pair by pair against allowed()
// (tests/cuda_mask_predicate_test.cpp).
//
// The predicate is factored in two steps so a kernel pays the coordinate
// arithmetic once per token, not once per (query, key) pair:
//   mask_token(): what the mask needs of one token: `forced` (text, every token
//                 under a dense mask, frame 0 with the anchor on: every pair with
//                 it is allowed) or `code` (video position in the band's order,
//                 or the frame index for a frame window);
//   mask_allows(): a pair is allowed when either side is forced or the codes
//                 differ by at most the mask's width (-1 keeps no pair).
#pragma once

#include <cstdint>

#include "cuda/video_order.hpp"

namespace stsa::cuda_detail {

// A token grid (layout.hpp) and the order its tokens are stored in.
struct PredicateGrid {
  std::int32_t frames = 1;
  std::int32_t per_frame = 1;
  std::int32_t text_tokens = 0;
  bool text_before = false;
  bool spatial_major = false;  // storage order of the tensors
};

enum class PredicateKind : std::int32_t { Dense, Band, FrameWindow };

struct PredicateMask {
  PredicateKind kind = PredicateKind::Dense;
  bool band_spatial_major = false;  // Band: the order the band is measured in
  std::int32_t width = -1;          // band or frame radius, clamped to 2^31 - 1; -1 keeps no pair
  bool anchor = true;
};

struct MaskToken {
  bool forced = true;
  std::int32_t code = 0;
};

// `position` is a token position in [0, tokens) in the grid's storage order.
STSA_HOST_DEVICE MaskToken mask_token(const PredicateGrid& g, const PredicateMask& m, std::int32_t position) {
  const std::int32_t begin = g.text_before ? g.text_tokens : 0;
  const std::int32_t video = g.frames * g.per_frame;
  if (position < begin || position - begin >= video) return {true, 0};  // text
  const auto at = video_coordinates<std::int32_t>(position - begin, g.frames, g.per_frame, g.spatial_major);
  if (m.kind == PredicateKind::Dense || (m.anchor && at.frame == 0)) return {true, 0};
  if (m.kind == PredicateKind::FrameWindow) return {false, at.frame};
  return {false, video_position<std::int32_t>(at.frame, at.patch, g.frames, g.per_frame, m.band_spatial_major)};
}

STSA_HOST_DEVICE bool mask_allows(const PredicateMask& m, MaskToken q, MaskToken k) {
  if (q.forced || k.forced) return true;
  // Codes lie in [0, 2^31 - 1), so the difference fits 32 bits.
  const std::int32_t distance = q.code > k.code ? q.code - k.code : k.code - q.code;
  return distance <= m.width;
}

// The keys one row allows, as a window of codes: key code c (-1 where forced)
// is allowed when c < 0 or c - lo, taken as unsigned, is at most span. A
// forced row takes every key (lo 0, span 2^32 - 1); a width of -1 takes only
// the forced keys (lo 2^31 - 1, which every code lies below). The routing
// kernels' per-pair form: one subtraction and one comparison, no branch.
struct RowWindow {
  std::int32_t lo = 0;
  std::uint32_t span = 0xffffffffu;
};

STSA_HOST_DEVICE RowWindow row_window(const PredicateMask& m, MaskToken row) {
  constexpr std::int64_t kMaxCode = 2147483647;  // codes lie below it
  if (row.forced) return {};
  if (m.width < 0) return {std::int32_t(kMaxCode), 0u};
  const std::int64_t lo = row.code - std::int64_t(m.width) > 0 ? row.code - std::int64_t(m.width) : 0;
  const std::int64_t hi = row.code + std::int64_t(m.width) < kMaxCode ? row.code + std::int64_t(m.width) : kMaxCode;
  return {std::int32_t(lo), std::uint32_t(hi - lo)};
}

// window_allows() as `bit` or 0: the kernels OR it into a word of allowed
// keys (a bool per pair compiles to byte shuffles there).
STSA_HOST_DEVICE std::uint32_t window_bit(RowWindow w, std::int32_t key_code, std::uint32_t bit) {
  return (std::uint32_t(key_code) - std::uint32_t(w.lo) <= w.span ? bit : 0u) | (key_code < 0 ? bit : 0u);
}

STSA_HOST_DEVICE bool window_allows(RowWindow w, std::int32_t key_code) { return window_bit(w, key_code, 1u) != 0u; }

STSA_HOST_DEVICE bool mask_allows_at(const PredicateGrid& g, const PredicateMask& m, std::int32_t q_position,
                                     std::int32_t k_position) {
  return mask_allows(m, mask_token(g, m, q_position), mask_token(g, m, k_position));
}

}  // namespace stsa::cuda_detail
