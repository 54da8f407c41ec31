// A mask spec unrolled into per-token codes, so that a sampled query row can be
// tested against all N keys with one comparison per key instead of coordinate
// arithmetic per pair. Exactly the predicate of mask.hpp (tested against
// allowed_at() by brute force in router_test).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/mask.hpp"

namespace stsa::router_detail {

struct CandidateMask {
  static constexpr std::int64_t kBlock = 64;  // keys per block of the summaries below
  enum class Cover : std::uint8_t { None, Some, All };

  MaskSpec spec;
  std::vector<std::int32_t> code;    // per tensor position: video position in band order, or frame index
  std::vector<std::uint8_t> forced;  // per tensor position: text, or frame 0 with the anchor on: every pair allowed
  std::int64_t width = -1;           // |code(q) - code(k)| <= width
  // Per block of kBlock keys: code range of its non-forced keys (lo > hi: none) and
  // whether any key is forced, so that a query row can skip a block or take it
  // whole without testing each key (most blocks are one or the other).
  std::vector<std::int32_t> block_lo, block_hi;
  std::vector<std::uint8_t> block_forced;

  bool allows(std::int64_t q, std::int64_t k) const {
    const auto qi = std::size_t(q), ki = std::size_t(k);
    return forced[qi] || forced[ki] || std::llabs(std::int64_t(code[qi]) - code[ki]) <= width;
  }

  // Which keys of block `block` query position q may attend: none, some or all.
  Cover cover(std::int64_t q, std::int64_t block) const {
    const auto qi = std::size_t(q), bi = std::size_t(block);
    if (forced[qi] || block_lo[bi] > block_hi[bi]) return Cover::All;
    const std::int64_t lo = std::int64_t(code[qi]) - width, hi = std::int64_t(code[qi]) + width;
    if (lo <= block_lo[bi] && block_hi[bi] <= hi) return Cover::All;
    if (!block_forced[bi] && (block_hi[bi] < lo || block_lo[bi] > hi)) return Cover::None;
    return Cover::Some;
  }
};

// O(N): the codes of `spec` for tensors whose tokens are stored in `tensor_order`.
CandidateMask make_candidate_mask(const VideoGrid& grid, const MaskSpec& spec, TokenOrder tensor_order);

}  // namespace stsa::router_detail
