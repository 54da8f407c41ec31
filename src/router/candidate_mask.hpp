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
  MaskSpec spec;
  std::vector<std::int32_t> code;    // per tensor position: video position in band order, or frame index
  std::vector<std::uint8_t> forced;  // per tensor position: text, or frame 0 with the anchor on: every pair allowed
  std::int64_t width = -1;           // |code(q) - code(k)| <= width

  bool allows(std::int64_t q, std::int64_t k) const {
    const auto qi = std::size_t(q), ki = std::size_t(k);
    return forced[qi] || forced[ki] || std::llabs(std::int64_t(code[qi]) - code[ki]) <= width;
  }
};

// O(N): the codes of `spec` for tensors whose tokens are stored in `tensor_order`.
CandidateMask make_candidate_mask(const VideoGrid& grid, const MaskSpec& spec, TokenOrder tensor_order);

}  // namespace stsa::router_detail
