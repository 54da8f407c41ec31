// Where an attention launch stores a row of O and LSE: routed attention's
// temporal heads run packed and in spatial-major order, and their rows go
// straight back to the caller's frame-major tensors from the kernel's stores
// (cuda_scatter_heads fused into the epilogue: no packed O, no second pass).
// Host/device arithmetic, host-tested against permutation_map().
#pragma once

#include "cuda/host_device.hpp"
#include "cuda/video_order.hpp"

namespace stsa::cuda_detail {

// The token order of the launch's tensors and of its outputs; equal orders
// (the default) store every row in place.
struct OutputOrder {
  int video_begin = 0, frames = 1, per_frame = 1;
  bool tokens_spatial_major = false;  // the order of q/k/v, the kernel's rows
  bool out_spatial_major = false;     // the order of o and lse
};

// Position in o / lse of the row at `token` (0 <= token < tokens) of the launch.
STSA_HOST_DEVICE int output_token(const OutputOrder& order, int token) {
  if (order.tokens_spatial_major == order.out_spatial_major) return token;
  // reordered_position(p, ..., to, from) is where, in order `from`, the token at
  // position p of order `to` sits: here `to` is the kernel's order.
  return reordered_position<int>(token, order.video_begin, order.frames, order.per_frame, order.tokens_spatial_major,
                                 order.out_spatial_major);
}

}  // namespace stsa::cuda_detail
