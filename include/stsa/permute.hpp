// Token permutation between frame-major and spatial-major order, for a subset of heads.
//
// A temporal head's plan indexes tokens in spatial-major order (frame 0 kept as
// one block in front, text tokens in place; see layout.hpp). Before a tiled
// backend runs such heads, gather_heads() copies their Q, K and V into packed
// [B, N, Ht, D] buffers in the plan's order, in one pass over the tokens; after
// it ran, scatter_heads() writes the packed O (and LSE) back in one pass. The
// copies move raw element bytes, so a gather followed by a scatter restores the
// original bits exactly, for any dtype and any strides.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/tensor.hpp"

namespace stsa {

// map[to_position] = from_position of the same token (a bijection on [0, N)).
std::vector<std::int64_t> permutation_map(const VideoGrid& grid, TokenOrder from, TokenOrder to);

// Copies heads `heads` of every sources[i] (logical [B, N, H, D], tokens in `from`
// order) into packed[i] (logical [B, N, heads.size(), D], tokens in `to` order):
// source head heads[j] becomes packed head j (a head listed twice is copied twice:
// grouped-query attention's K/V head for two query heads). Shapes (one batch size for
// every pair), dtypes (equal per pair), head indices (in range) and overlap are
// checked before any copy: each destination's elements at distinct, aligned
// addresses, and no destination over a source or over another destination (of any pair).
// threads = 0 picks a count from the work size, at most resolve_threads(0) (cpu.hpp).
void gather_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                  std::span<const TensorView> sources, std::span<const TensorView> packed, int threads = 0);

// The inverse: packed head j of packed[i] (tokens in `from` order) goes to head
// heads[j] of dests[i] (tokens in `to` order); heads distinct. When packed_lse.data and lse.data are
// set, LSE rows ([B, Ht, N] -> [B, H, N]) move in the same pass, checked as the
// tensors are (the LSE destination over no tensor, no destination over the packed LSE).
void scatter_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                   std::span<const TensorView> packed, std::span<const TensorView> dests, const LseView& packed_lse = {},
                   const LseView& lse = {}, int threads = 0);

// Copy bandwidth of this machine: memcpy of a `bytes` buffer with `threads`
// threads (0: resolve_threads(0), cpu.hpp), best of a few runs, counting bytes read + bytes written
// (the same accounting as permutation_bytes() in flops.hpp), in GB/s.
double measure_copy_gbps(std::size_t bytes = std::size_t(64) << 20, int threads = 0);

}  // namespace stsa
