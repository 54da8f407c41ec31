// What gather_heads / scatter_heads (permute.hpp) check before any copy, shared with
// their CUDA twins (cuda_gather_heads / cuda_scatter_heads), which make the same checks.
#pragma once

#include <cstdint>
#include <span>

#include "stsa/layout.hpp"
#include "stsa/tensor.hpp"

namespace stsa::router_detail {

// `full` are the [B, N, H, D] tensors and `packed` their [B, N, heads.size(), D] copies: a
// gather reads full and writes packed, a scatter the reverse, its LSE rows (packed_lse ->
// lse, both or neither) in the same pass. Checks the grid, the head indices, each pair's
// shapes, dtypes and strides, one batch size for every pair, and that what is written has
// its elements at distinct, aligned addresses and lies over nothing else the pass reads or
// writes. InvalidArgument, its message starting with `what`, for the first that fails.
void check_permutation(const char* what, const VideoGrid& grid, std::span<const std::int64_t> heads,
                       std::span<const TensorView> full, std::span<const TensorView> packed, bool gather,
                       const LseView& packed_lse = {}, const LseView& lse = {});

}  // namespace stsa::router_detail
